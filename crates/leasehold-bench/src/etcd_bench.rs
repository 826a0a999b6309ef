//! etcd: our acquire + release cycle against etcd's own Lock + Unlock RPCs, on a shared
//! kept-alive lease and on a lease granted and revoked per lock, on the single member and on
//! the 3-member cluster of `scripts/services`.

use std::time::Duration;

use etcd_client::{Client, LockOptions as RawLockOptions};
use leasehold_core::{LockOptions, Locker, Renewal};
use leasehold_etcd::{EtcdBackend, EtcdConfig, LeaseMode};
use leasehold_test_support::services::{self, Service};
use tokio::task::JoinHandle;

use crate::Cli;
use crate::harness::{BoxError, Report, interleaved, runtime, runtimes};
use crate::report::{Bar, Table};
use crate::stats::{Summary, ms};

/// What one run of `leasehold-bench etcd` measures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Params {
    /// Sequential cycles per implementation and deployment.
    pub(crate) iterations: usize,
}

/// The deployment names `--deployments` accepts.
pub(crate) const DEPLOYMENTS: [&str; 2] = ["single", "cluster"];

const TTL: Duration = Duration::from_secs(30);
/// TTL of the raw shared lease; kept alive every third of it.
const RAW_LEASE_TTL: i64 = 30;
/// How long one acquire may wait (the key is never contended; this only bounds a stuck run).
const WAIT: Duration = Duration::from_secs(5);

/// The four cycles measured, in the order they run in each round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cycle {
    /// `Locker::acquire` + `Lease::release` on the backend's session lease (the default).
    OursSession,
    /// The same with [`LeaseMode::PerLock`]: a lease granted per acquisition, revoked on
    /// release (in the background).
    OursPerLock,
    /// etcd's Lock RPC + Unlock RPC on one lease granted up front and kept alive.
    RawShared,
    /// Lease grant + Lock RPC + Unlock RPC + lease revoke, each awaited.
    RawPerLock,
}

const CYCLES: [Cycle; 4] = [
    Cycle::OursSession,
    Cycle::OursPerLock,
    Cycle::RawShared,
    Cycle::RawPerLock,
];

impl Cycle {
    fn label(self) -> &'static str {
        match self {
            Self::OursSession => "leasehold EtcdBackend, session lease (default)",
            Self::OursPerLock => "leasehold EtcdBackend, lease per lock",
            Self::RawShared => "raw etcd Lock + Unlock RPCs, shared kept-alive lease",
            Self::RawPerLock => "raw lease grant + Lock + Unlock + lease revoke",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Self::OursSession => "leasehold session lease",
            Self::OursPerLock => "leasehold lease per lock",
            Self::RawShared => "raw Lock+Unlock, shared lease",
            Self::RawPerLock => "raw grant+Lock+Unlock+revoke",
        }
    }
}

/// Everything one deployment's cycles need.
struct Fixture {
    session: Locker,
    per_lock: Locker,
    raw: Client,
    shared_lease: i64,
    keeper: JoinHandle<()>,
    prefix: String,
}

impl Fixture {
    async fn new(endpoints: &[String]) -> Result<Self, BoxError> {
        let prefix = format!("{}/", services::unique_prefix("bench-etcd"));
        let ours = |mode: LeaseMode| {
            let cfg = EtcdConfig::new(endpoints.iter().cloned())
                .with_prefix(&prefix)
                .map(|c| c.with_lease_mode(mode));
            async move {
                let backend = EtcdBackend::connect(cfg?).await?;
                Ok::<_, BoxError>(
                    Locker::new(backend).with_options(
                        LockOptions::default()
                            .with_ttl(TTL)
                            .with_renewal(Renewal::Off),
                    )?,
                )
            }
        };
        let session = ours(LeaseMode::Session).await?;
        let per_lock = ours(LeaseMode::PerLock).await?;
        let raw = Client::connect(endpoints, None).await?;
        let shared_lease = raw.lease_client().grant(RAW_LEASE_TTL, None).await?.id();
        let keeper = tokio::spawn(keep_alive(raw.clone(), shared_lease));
        Ok(Self {
            session,
            per_lock,
            raw,
            shared_lease,
            keeper,
            prefix,
        })
    }

    async fn cycle(&self, which: Cycle) -> Result<(), BoxError> {
        match which {
            Cycle::OursSession | Cycle::OursPerLock => {
                let (locker, key) = if which == Cycle::OursSession {
                    (&self.session, "session")
                } else {
                    (&self.per_lock, "per-lock")
                };
                let lease = locker.acquire(key, WAIT).await?;
                lease.release().await?;
            }
            Cycle::RawShared => {
                let name = format!("{}raw-shared", self.prefix);
                self.raw_lock(name, self.shared_lease).await?;
            }
            Cycle::RawPerLock => {
                let mut leases = self.raw.lease_client();
                let id = leases
                    .grant(i64::try_from(TTL.as_secs())?, None)
                    .await?
                    .id();
                let name = format!("{}raw-per-lock", self.prefix);
                self.raw_lock(name, id).await?;
                leases.revoke(id).await?;
            }
        }
        Ok(())
    }

    /// One Lock RPC + Unlock RPC on `lease`.
    async fn raw_lock(&self, name: String, lease: i64) -> Result<(), BoxError> {
        let mut lock = self.raw.lock_client();
        let held = tokio::time::timeout(
            WAIT,
            lock.lock(name, Some(RawLockOptions::new().with_lease(lease))),
        )
        .await
        .map_err(|_| "raw Lock RPC: no grant within the wait budget")??;
        lock.unlock(held.key().to_vec()).await?;
        Ok(())
    }

    async fn close(self) -> Result<(), BoxError> {
        self.keeper.abort();
        self.raw.lease_client().revoke(self.shared_lease).await?;
        Ok(())
    }
}

/// Keeps the raw shared lease alive (as a real user of the Lock RPC must) until aborted.
async fn keep_alive(client: Client, id: i64) {
    let every = Duration::from_secs(u64::try_from(RAW_LEASE_TTL / 3).unwrap_or(10));
    let mut leases = client.lease_client();
    let Ok((mut keeper, mut stream)) = leases.keep_alive(id).await else {
        eprintln!("leasehold-bench: cannot keep the raw shared lease alive");
        return;
    };
    loop {
        tokio::time::sleep(every).await;
        if keeper.keep_alive().await.is_err() || !matches!(stream.message().await, Ok(Some(_))) {
            eprintln!("leasehold-bench: the raw shared lease's keep-alive failed");
            return;
        }
    }
}

/// One deployment, on the current runtime: a table and the chart's bars.
async fn deployment(
    p: Params,
    rt: &str,
    name: &str,
    service: Service,
) -> Result<(Table, Vec<Bar>), BoxError> {
    let endpoints = services::lookup(service)?.urls().to_vec();
    let fx = Fixture::new(&endpoints).await?;
    // Warm-up: connections, the session lease, the server's lock service.
    let warmup = (p.iterations / 10).clamp(1, 20);
    let result = interleaved(p.iterations, CYCLES.len(), warmup, async |i| {
        fx.cycle(CYCLES[i]).await
    })
    .await;
    fx.close().await?;
    let s = result?;
    let mut t = Table::new(
        &format!(
            "etcd {name} ({} endpoint(s)): acquire + release cycle ({rt} runtime, {} cycles each)",
            endpoints.len(),
            p.iterations
        ),
        &[
            "implementation",
            "p50",
            "p99",
            "cycles/s",
            "p50 vs raw shared",
        ],
    );
    let raw_p50 = s[2].p50.as_secs_f64();
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
            label: format!("etcd {name}: {} ({rt})", c.short()),
            ms: x.p50.as_secs_f64() * 1e3,
        });
    }
    t.note(format!(
        "Ours (session lease) / raw Lock + Unlock on a shared lease, p50: **{:.3}×** (target ≤ 1.1×). \
         A lease per lock: ours **{:.2}×**, raw **{:.2}×** the shared-lease raw cycle \
         (our per-lock release revokes the lease in the background, outside the measured cycle).",
        ratio(&s[0]),
        ratio(&s[1]),
        ratio(&s[3]),
    ));
    Ok((t, bars))
}

/// `leasehold-bench etcd`: the chosen deployments on the chosen runtimes; prints Markdown and
/// writes `etcd.md` and `etcd.svg` to the output folder.
pub(crate) fn main(cli: &Cli, p: Params, deployments: &[String]) -> Result<(), BoxError> {
    for d in deployments {
        if !DEPLOYMENTS.contains(&d.as_str()) {
            return Err(
                format!("unknown deployment {d:?}; expected some of {DEPLOYMENTS:?}").into(),
            );
        }
    }
    let mut report = Report::new("etcd");
    for flavour in runtimes(cli.runtime) {
        let rt = runtime(flavour)?;
        for (short, name, service) in [
            ("single", "single member", Service::Etcd),
            ("cluster", "3-member cluster", Service::EtcdCluster),
        ] {
            if !deployments.iter().any(|d| d == short) {
                continue;
            }
            let (t, b) = rt.block_on(deployment(p, flavour, name, service))?;
            report.table(&t);
            report.bars(b);
        }
    }
    report.write(&cli.out, "etcd lock cycle p50 (lower is better)")
}
