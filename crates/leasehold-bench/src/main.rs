//! `leasehold-bench`: comparative benchmarks of leasehold's backends and the safety torture
//! table, run as a program against the real servers of `scripts/services` (never as timed
//! tests).
//!
//! ```text
//! scripts/services up
//! cargo run --release -p leasehold-bench -- perf               # every group, into target/bench
//! cargo run --release -p leasehold-bench -- safety --runs 20   # the safety table, likewise
//! ```
//!
//! BENCHMARKS.md gives the commands that write the committed tables under `docs/bench`.
//!
//! Two subcommands over one set of subjects ([`subjects`]) and one report pipeline
//! ([`report`]): `perf` (latency, throughput, contention, repeated and pinned measurements)
//! and `safety` (every backend under every fault that applies). Figures are ratios measured in
//! one run, in alternating rounds, because the machines are shared and noisy. Each writes its
//! Markdown (headed by the command, the commit and the date), its CSV and, for `perf`, SVG
//! charts to the output folder (default `target/bench`).

mod file_backend;
mod harness;
mod perf;
mod report;
mod safety;
mod stats;
mod subjects;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use harness::{BoxError, Runtimes};

#[derive(Parser)]
#[command(
    about = "Comparative benchmarks and the safety table of leasehold's backends, against real servers"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Where to write the Markdown report, the CSV and the SVG charts.
    #[arg(long, default_value = "target/bench", global = true)]
    out: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Every backend side by side with its raw protocol cycle and the peer crates (with
    /// `--features peers`): uncontended latency, throughput on distinct keys, one contended
    /// key, Redlock on 3/5/7 nodes and with one node black-holed or slowed, our Redis cycles
    /// against redis-benchmark, semaphore permit cycles, leader failover times, the LockLayer
    /// overhead, and PostgreSQL pinned to its own CPU with repeats. Writes perf.md, perf.csv
    /// and SVG charts.
    Perf(PerfArgs),
    /// The safety torture table: every backend under every fault that applies (client pause,
    /// delayed response, Redis node restarted empty, clock jump, pg_terminate_backend, etcd
    /// leader kill and lease revoke), counting overlapping holders and stale writes with and
    /// without fencing. Writes safety.md and safety.csv; fails if an invariant breaks.
    Safety(SafetyArgs),
    /// One measurement of the `fleet` perf group, in a process of its own (internal).
    #[command(name = "__fleet", hide = true)]
    Fleet(FleetArgs),
    /// A leader of the `failover` perf group, in a process of its own to be killed (internal).
    #[command(name = "__leader", hide = true)]
    Leader(LeaderArgs),
}

#[derive(Args)]
struct LeaderArgs {
    #[arg(long)]
    backend: String,
    #[arg(long)]
    at: String,
    #[arg(long)]
    key: String,
    #[arg(long)]
    prefix: String,
}

#[derive(Args)]
struct FleetArgs {
    #[arg(long)]
    backend: String,
    #[arg(long)]
    n: usize,
    #[arg(long)]
    runtime: String,
    #[arg(long)]
    hold_ms: u64,
    #[arg(long)]
    settle_ms: u64,
    #[arg(long)]
    quick: bool,
}

#[derive(Args)]
struct PerfArgs {
    /// Smoke test: every group with tiny counts, well under a minute; fails on any error,
    /// lock left behind or nonsensical figure, never on timings.
    #[arg(long)]
    quick: bool,
    /// Which Tokio runtime(s) to measure on.
    #[arg(long, value_enum, default_value_t = Runtimes::Both)]
    runtime: Runtimes,
    /// Cycles per implementation in the uncontended scenario.
    #[arg(long, default_value_t = 1_000)]
    iterations: usize,
    /// At most this many seconds per implementation in the uncontended scenario.
    #[arg(long, default_value_t = 4.0)]
    cycle_budget_secs: f64,
    /// Task counts of the throughput scenario (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    concurrency: Vec<usize>,
    /// Seconds each implementation runs at each task count of the throughput scenario, over
    /// its `--repeats` rounds (and the seconds of our side of the redis-benchmark group).
    #[arg(long, default_value_t = 2.5)]
    throughput_secs: f64,
    /// Clients contending on one key.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// Seconds of each contention run.
    #[arg(long, default_value_t = 2.0)]
    contention_secs: f64,
    /// Measurements of the repeated groups: the pinned PostgreSQL groups measure this many
    /// times, each on new connections (so on new server processes); the LockLayer group
    /// runs 4 × this + 1 rounds; the failover group crashes this many leaders per backend;
    /// the throughput scenario and the handoff group measure every row in this many rounds
    /// taking turns. Their tables
    /// give medians and ranges.
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Cycles per implementation and repeat in the pinned PostgreSQL groups.
    #[arg(long, default_value_t = 2_000)]
    pinned_iterations: usize,
    /// Leave CPU placement to the scheduler in the pinned groups. By default, on a machine
    /// with two CPUs or more, they run the bench on the first CPU and PostgreSQL (the
    /// postmaster and every backend) on the last one (`scripts/services pin`), so that which
    /// vCPU serves which connection cannot decide the comparison; the affinity is restored
    /// at the end.
    #[arg(long)]
    no_pin: bool,
    /// Which groups to run (comma-separated; default all): memory, file, redis,
    /// redis-sentinel, redis-benchmark, redlock3, redlock5, redlock7, redlock5-blackhole,
    /// redlock5-slow, postgres-tcp, postgres-unix, etcd, etcd-cluster, semaphore (a permit
    /// cycle against the lock cycle on each backend that gives semaphores), handoff (release
    /// to the next grant with 1 and 64 waiters on one key, on each backend that waits), failover (leader
    /// crash and resign() to a new leader on each backend that gives elections, `--repeats`
    /// times, on the first runtime), tower-layer, fleet, postgres-tcp-pinned,
    /// postgres-unix-pinned.
    #[arg(long, value_delimiter = ',')]
    groups: Vec<String>,
}

impl PerfArgs {
    fn params(&self) -> Result<perf::model::Params, BoxError> {
        let mut p = perf::model::Params::quick(self.groups.clone(), !self.no_pin);
        if !self.quick {
            p = perf::model::Params {
                iterations: self.iterations,
                cycle_budget: Duration::try_from_secs_f64(self.cycle_budget_secs)?,
                concurrency: self.concurrency.clone(),
                throughput: Duration::try_from_secs_f64(self.throughput_secs)?,
                clients: self.clients,
                contention: Duration::try_from_secs_f64(self.contention_secs)?,
                repeats: self.repeats,
                pinned_iterations: self.pinned_iterations,
                waiters: vec![1, 64],
                handoffs: 200,
                handoff_budget: Duration::from_secs(5),
                quick: false,
                ..p
            };
        }
        Ok(p)
    }
}

#[derive(Args)]
struct SafetyArgs {
    /// Smoke test: one run per cell (about a minute), for the test command.
    #[arg(long)]
    quick: bool,
    /// Runs per (backend, fault) cell (default 5; 1 with --quick).
    #[arg(long)]
    runs: Option<usize>,
    /// Which backends (comma-separated): memory, file, redis, redlock, postgres, etcd.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "memory,file,redis,redlock,postgres,etcd"
    )]
    backends: Vec<String>,
    /// Which faults (comma-separated): pause, delay, restart, restart-delayed, clock-jump,
    /// pg-terminate, member-kill, lease-revoke, partition (root only: network namespaces),
    /// failover, failover-wait (the Redis Sentinel topology of scripts/services).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "pause,delay,restart,restart-delayed,clock-jump,pg-terminate,member-kill,lease-revoke,partition,failover,failover-wait"
    )]
    faults: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Perf(args) => args
            .params()
            .and_then(|p| perf::main(&cli.out, &args.runtime.names(), &p)),
        Command::Safety(args) => {
            let params = safety::model::Params {
                runs: args.runs.unwrap_or(if args.quick { 1 } else { 5 }),
                backends: args.backends.clone(),
                faults: args.faults.clone(),
            };
            safety::main(&cli.out, &params)
        }
        Command::Leader(a) => perf::failover::child_main(&a.backend, &a.at, &a.key, &a.prefix),
        Command::Fleet(a) => perf::fleet::child_main(&perf::fleet::Spec {
            backend: a.backend.clone(),
            n: a.n,
            runtime: a.runtime.clone(),
            hold: Duration::from_millis(a.hold_ms),
            settle: Duration::from_millis(a.settle_ms),
            quick: a.quick,
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasehold-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
