//! etcd: our acquire + release cycle against etcd's own Lock + Unlock RPCs, on a shared
//! kept-alive lease and on a lease granted and revoked per lock, on the single member and on
//! the 3-member cluster of `scripts/services`.

use std::error::Error;
use std::path::Path;
use std::time::Duration;

use etcd_client::{Client, LockOptions as RawLockOptions};
use leasehold_core::{LockOptions, Locker, Renewal};
use leasehold_etcd::{EtcdBackend, EtcdConfig, LeaseMode};
use leasehold_test_support::services::{self, Service};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::report::{self, Bar, Table};
use crate::stats::{Summary, ms};
use crate::{Cli, Runtimes};

type BoxError = Box<dyn Error + Send + Sync>;

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
const ROUNDS: usize = 10;
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
                .with_lease_mode(mode);
            async move {
                let backend = EtcdBackend::connect(cfg).await?;
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

/// Runs the four cycles in alternating rounds (so drift in machine load hits all alike).
async fn measure(fx: &Fixture, n: usize) -> Result<Vec<Summary>, BoxError> {
    let per = (n / ROUNDS).max(1);
    // Warm-up: connections, the session lease, the server's lock service.
    for _ in 0..per.min(20) {
        for c in CYCLES {
            fx.cycle(c).await?;
        }
    }
    let mut samples: Vec<Vec<Duration>> = CYCLES.iter().map(|_| Vec::with_capacity(n)).collect();
    for _ in 0..ROUNDS {
        for (c, out) in CYCLES.iter().zip(samples.iter_mut()) {
            for _ in 0..per {
                let t0 = Instant::now();
                fx.cycle(*c).await?;
                out.push(t0.elapsed());
            }
        }
    }
    Ok(samples.into_iter().map(Summary::of).collect())
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
    let result = measure(&fx, p.iterations).await;
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
    let flavours: &[&str] = match cli.runtime {
        Runtimes::Both => &["multi-thread", "current-thread"],
        Runtimes::MultiThread => &["multi-thread"],
        Runtimes::CurrentThread => &["current-thread"],
    };
    let mut markdown = String::from("## leasehold-bench etcd\n\n");
    let mut bars = Vec::new();
    for &flavour in flavours {
        let rt = if flavour == "multi-thread" {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?
        };
        for (name, service) in [
            ("single member", Service::Etcd),
            ("3-member cluster", Service::EtcdCluster),
        ] {
            let short = if service == Service::Etcd {
                "single"
            } else {
                "cluster"
            };
            if !deployments.iter().any(|d| d == short) {
                continue;
            }
            let (t, b) = rt.block_on(deployment(p, flavour, name, service))?;
            let md = t.markdown();
            println!("{md}");
            markdown.push_str(&md);
            markdown.push('\n');
            bars.extend(b);
        }
    }
    write(&cli.out, &markdown, &bars)
}

fn write(out: &Path, markdown: &str, bars: &[Bar]) -> Result<(), BoxError> {
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("etcd.md"), markdown)?;
    report::chart(
        &out.join("etcd.svg"),
        "etcd lock cycle p50 (lower is better)",
        bars,
    )
    .map_err(|e| e.to_string())?;
    eprintln!(
        "wrote {} and {}",
        out.join("etcd.md").display(),
        out.join("etcd.svg").display()
    );
    Ok(())
}
