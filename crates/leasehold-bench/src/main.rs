//! `leasehold-bench`: comparative benchmarks of leasehold's backends, run as a program against
//! the real servers of `scripts/services` (never as timed tests).
//!
//! ```text
//! scripts/services up
//! cargo run --release -p leasehold-bench -- redis
//! ```
//!
//! Figures are ratios measured in one run, in alternating rounds, because the machines are
//! shared and noisy. Results print as Markdown and are written, with an SVG chart, to the
//! output folder (default `target/bench`).

mod etcd_bench;
mod harness;
mod perf;
mod pg_bench;
mod redis_bench;
mod report;
mod safety;
mod safety_check;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(about = "Comparative benchmarks of leasehold's backends against real servers")]
struct Cli {
    #[command(subcommand)]
    suite: Suite,
    /// Where to write the Markdown report and the SVG chart.
    #[arg(long, default_value = "target/bench", global = true)]
    out: PathBuf,
    /// Which Tokio runtime(s) to measure on.
    #[arg(long, value_enum, default_value_t = Runtimes::Both, global = true)]
    runtime: Runtimes,
}

#[derive(Subcommand)]
enum Suite {
    /// The safety torture table: every backend under every fault that applies (client pause,
    /// delayed response, Redis node restarted empty, clock jump, pg_terminate_backend, etcd
    /// leader kill and lease revoke), counting overlapping holders and stale writes with and
    /// without fencing. Writes safety.md and safety.csv; fails if an invariant breaks.
    Safety {
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
        /// pg-terminate, member-kill, lease-revoke.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "pause,delay,restart,restart-delayed,clock-jump,pg-terminate,member-kill,lease-revoke"
        )]
        faults: Vec<String>,
    },
    /// Every backend side by side with its raw protocol cycle and the peer crates (with
    /// `--features peers`): uncontended latency, throughput on distinct keys, one contended
    /// key, Redlock on 3/5/7 nodes and with one node black-holed or slowed. Writes perf.md,
    /// perf.csv and SVG charts.
    Perf {
        /// Smoke test: every group with tiny counts, well under a minute; fails on any error,
        /// lock left behind or nonsensical figure, never on timings.
        #[arg(long)]
        quick: bool,
        /// Cycles per implementation in the uncontended scenario.
        #[arg(long, default_value_t = 1_000)]
        iterations: usize,
        /// At most this many seconds per implementation in the uncontended scenario.
        #[arg(long, default_value_t = 4.0)]
        cycle_budget_secs: f64,
        /// Task counts of the throughput scenario (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
        concurrency: Vec<usize>,
        /// Seconds of each throughput run.
        #[arg(long, default_value_t = 1.0)]
        throughput_secs: f64,
        /// Clients contending on one key.
        #[arg(long, default_value_t = 8)]
        clients: usize,
        /// Seconds of each contention run.
        #[arg(long, default_value_t = 2.0)]
        contention_secs: f64,
        /// Which groups to run (comma-separated; default all): memory, file, redis, redlock3,
        /// redlock5, redlock7, redlock5-blackhole, redlock5-slow, postgres-tcp, postgres-unix,
        /// etcd, etcd-cluster.
        #[arg(long, value_delimiter = ',')]
        groups: Vec<String>,
    },
    /// Single-node Redis and Redlock against raw redis-rs, rslock, redis-benchmark and
    /// PostgreSQL's server queue.
    Redis {
        /// Sequential cycles per implementation and scenario.
        #[arg(long, default_value_t = 2_000)]
        iterations: usize,
        /// Seconds of each contention run.
        #[arg(long, default_value_t = 3)]
        contention_secs: u64,
        /// Seconds of the 64-task throughput run.
        #[arg(long, default_value_t = 3)]
        throughput_secs: u64,
        /// Which scenarios to run (comma-separated): single, redlock, throughput, contention.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "single,redlock,throughput,contention"
        )]
        scenarios: Vec<String>,
    },
    /// etcd (single member and 3-member cluster) against its raw Lock + Unlock RPCs, on a
    /// shared lease and on a lease per lock.
    Etcd {
        /// Sequential cycles per implementation and deployment.
        #[arg(long, default_value_t = 300)]
        iterations: usize,
        /// Which deployments to run (comma-separated): single, cluster.
        #[arg(long, value_delimiter = ',', default_value = "single,cluster")]
        deployments: Vec<String>,
    },
    /// PostgreSQL advisory locks against the raw prepared try-lock + unlock cycle and sqlx's
    /// `PgAdvisoryLock`, over TCP and the unix socket.
    Postgres {
        /// Sequential cycles per implementation and transport.
        #[arg(long, default_value_t = 2_000)]
        iterations: usize,
        /// Which transports to run (comma-separated): tcp, unix.
        #[arg(long, value_delimiter = ',', default_value = "tcp,unix")]
        transports: Vec<String>,
        /// Measurements per transport and runtime, each on new connections (so on new server
        /// processes); the tables give the median ratio and its range.
        #[arg(long, default_value_t = 5)]
        repeats: usize,
        /// Leave CPU placement to the scheduler. By default, on a machine with two CPUs or
        /// more, the bench runs on the first CPU and PostgreSQL (the postmaster and every
        /// backend) on the last one (`scripts/services pin`), so that which vCPU serves which
        /// connection cannot decide the comparison; the affinity is restored at the end.
        #[arg(long)]
        no_pin: bool,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Runtimes {
    Both,
    MultiThread,
    CurrentThread,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("leasehold-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if let Suite::Safety {
        quick,
        runs,
        ref backends,
        ref faults,
    } = cli.suite
    {
        let params = safety::Params {
            runs: runs.unwrap_or(if quick { 1 } else { 5 }),
            backends: backends.clone(),
            faults: faults.clone(),
        };
        return safety::main(&cli.out, &params);
    }
    if let Suite::Perf {
        quick,
        iterations,
        cycle_budget_secs,
        ref concurrency,
        throughput_secs,
        clients,
        contention_secs,
        ref groups,
    } = cli.suite
    {
        let params = if quick {
            perf::Params::quick(groups.clone())
        } else {
            perf::Params {
                iterations,
                cycle_budget: Duration::try_from_secs_f64(cycle_budget_secs)?,
                concurrency: concurrency.clone(),
                throughput: Duration::try_from_secs_f64(throughput_secs)?,
                clients,
                contention: Duration::try_from_secs_f64(contention_secs)?,
                groups: groups.clone(),
                quick: false,
            }
        };
        return perf::main(cli, params);
    }
    if let Suite::Etcd {
        iterations,
        ref deployments,
    } = cli.suite
    {
        return etcd_bench::main(cli, etcd_bench::Params { iterations }, deployments);
    }
    if let Suite::Postgres {
        iterations,
        ref transports,
        repeats,
        no_pin,
    } = cli.suite
    {
        let p = pg_bench::Params {
            iterations,
            repeats,
            pin: !no_pin,
        };
        return pg_bench::main(cli, p, transports);
    }
    let Suite::Redis {
        iterations,
        contention_secs,
        throughput_secs,
        ref scenarios,
    } = cli.suite
    else {
        unreachable!("every other suite returned above");
    };
    for s in scenarios {
        if !redis_bench::SCENARIOS.contains(&s.as_str()) {
            return Err(format!(
                "unknown scenario {s:?}; expected some of {:?}",
                redis_bench::SCENARIOS
            )
            .into());
        }
    }
    let params = redis_bench::Params {
        iterations,
        contention: Duration::from_secs(contention_secs),
        throughput: Duration::from_secs(throughput_secs),
    };
    let mut report = harness::Report::new("redis");
    for flavour in harness::runtimes(cli.runtime) {
        let rt = harness::runtime(flavour)?;
        let outcome = rt.block_on(redis_bench::run(params, flavour, scenarios))?;
        for t in &outcome.tables {
            report.table(t);
        }
        report.bars(outcome.bars);
    }
    report.write(&cli.out, "Lock cycle p50 (lower is better)")
}
