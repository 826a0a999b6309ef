//! `leasehold`: take a lock from the shell, like `flock(1)` or `etcdctl lock`, on any leasehold
//! backend.
//!
//! ```text
//! leasehold run --key nightly -- ./job.sh                          # local file lock, no setup
//! leasehold run --key nightly --url postgres://… --wait 30s -- ./job.sh
//! leasehold run --key nightly --config /etc/app/locks.toml --no-wait -- ./job.sh
//!
//! lease=$(leasehold acquire --key deploy --url etcd://10.0.0.5:2379) || exit   # for scripts
//! eval "$lease"
//! ./deploy.sh --fence "$LEASEHOLD_FENCING_TOKEN"
//! leasehold release                                                    # uses $LEASEHOLD_HANDLE
//!
//! leasehold status --key deploy --url etcd://10.0.0.5:2379 [--json]
//!
//! leasehold elect --key scheduler --value "$(hostname)" --url etcd://10.0.0.5:2379 -- ./scheduler
//! leasehold leader --key scheduler --url etcd://10.0.0.5:2379 [--json]
//! ```
//!
//! # `run`
//!
//! The command gets `LEASEHOLD_KEY`, `LEASEHOLD_BACKEND`, `LEASEHOLD_LOCATION` (where the lock
//! lives, passwords masked) and, when the backend mints one, `LEASEHOLD_FENCING_TOKEN` in its
//! environment, and none of the backend's credentials (`LEASEHOLD_URL`, `LEASEHOLD_URLS`,
//! `LEASEHOLD_BACKEND_PASSWORD`…: see [`child`]). The lease is renewed while it runs; if it is
//! lost, the command's process group gets SIGTERM, then SIGKILL after `--grace`. The command
//! runs in a process group of its own, except when `leasehold` is the foreground job of a
//! terminal (then it shares `leasehold`'s, so job control keeps working, and only its own
//! process is signalled); on Linux it gets SIGKILL if `leasehold` dies. `docs/guide.md` says
//! what each choice covers and what it does not.
//!
//! # `acquire` and `release`
//!
//! Most backends' locks belong to the process (or database session) that took them: a file
//! lock or a PostgreSQL advisory lock dies with its process, Redis and etcd leases need
//! renewing. So `acquire` starts a **holder**: a detached `leasehold` process in a process group
//! of its own, which takes the lease, keeps it renewed, and reports the fencing token back to
//! `acquire` over a pipe. `acquire` prints shell assignments for `eval` and exits; the holder
//! stays until `release` (or SIGTERM) tells it to release, or the lease is lost. See
//! `docs/guide.md` for the protocol, the state files and the runtime folder.
//!
//! # `status`
//!
//! What the backend can tell about the current holder of a key (owner value, fencing token,
//! remaining TTL, session or lease), as text or `--json`.
//!
//! # `elect` and `leader`
//!
//! `elect` campaigns for the leadership of a key ([`leasehold::Elector`]) and runs the command
//! while leader, as `run` runs it under a lock, with `LEASEHOLD_TERM` (the leadership's term,
//! equal to `LEASEHOLD_FENCING_TOKEN`) added. A lost leadership stops the command as a lost
//! lease does under `run`; then `elect` campaigns again, or with `--once` exits 79. The
//! command ending on its own ends `elect`: it resigns and exits with the command's status.
//! `leader` prints the current leader's value and term (exit 0) or that there is none (1).
//!
//! # Exit status
//!
//! `run` and `elect` exit with the command's own status (128 + N if a signal N ended it); leasehold's own
//! codes are listed in the "Exit codes" table of the user guide (`docs/guide.md`), which is
//! rendered from this crate's definition of them and checked against it by its tests.

/// `println!` that does not panic when stdout is a closed pipe (`leasehold status | head -1`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

mod acquire;
mod child;
mod code;
mod elect;
mod holder;
mod leader;
mod lock;
mod release;
mod run;
mod status;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
// The holders' records live in the library, where the fuzz targets in `fuzz/` reach them.
use leasehold_cli::record;

use crate::lock::AcquireArgs;

/// How long the end of `main` waits for background releases ([`leasehold::settle`]).
const SETTLE: Duration = Duration::from_secs(5);

/// Where `--help` sends the reader for the exit codes.
const EXIT_CODES: &str = "Exit status: `run` and `elect` exit with the command's own status; \
                          every other code of leasehold is explained in the table \"Exit codes\" of the user \
                          guide, docs/guide.md.";

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Take locks and lead elections from the shell on any leasehold backend",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Acquire the lock, run the command while renewing it, release it.
    Run(run::RunArgs),
    /// Acquire the lock and leave a holder process keeping it; print shell assignments.
    Acquire(AcquireArgs),
    /// Tell the holder started by `acquire` to release the lock, and wait for it.
    Release(release::ReleaseArgs),
    /// Show what the backend can tell about the holder of a lock.
    Status(status::StatusArgs),
    /// Campaign for the leadership of a key; run the command while leader, with its term.
    ///
    /// The command gets `LEASEHOLD_TERM` (equal to `LEASEHOLD_FENCING_TOKEN`: hand it to
    /// fenced resources) besides what `run` gives it. When the leadership is lost the command
    /// gets SIGTERM (its process group), then SIGKILL after --grace, and `elect` campaigns
    /// again (with --once: exits 79). When the command ends on its own, `elect` resigns and
    /// exits with its status. SIGTERM or SIGINT: while campaigning, exit 143 or 130; while
    /// leading, passed on to the command, then `elect` resigns and exits with its status.
    Elect(elect::ElectArgs),
    /// Print the current leader of a key's election (value and term); exit 1 if none.
    Leader(leader::LeaderArgs),
    /// The holder process of `acquire` (internal).
    #[command(name = "__hold", hide = true)]
    Hold(AcquireArgs),
    /// What `run` starts: sets the parent-death signal, then becomes the command (internal).
    #[command(name = "__exec", hide = true)]
    Exec(child::ExecArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cli = match cli.command {
        // No runtime: this process only becomes the command.
        Cmd::Exec(args) => return ExitCode::from(child::exec(args)),
        command => Cli { command },
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("leasehold: cannot start: {e}");
            return ExitCode::from(code::CANNOT_RUN);
        }
    };
    ExitCode::from(rt.block_on(async move {
        let code = match cli.command {
            Cmd::Run(args) => run::run(args).await,
            Cmd::Acquire(args) => acquire::acquire(args),
            Cmd::Release(args) => release::release(args).await,
            Cmd::Status(args) => status::status(args).await,
            Cmd::Elect(args) => elect::elect(args).await,
            Cmd::Leader(args) => leader::leader(args).await,
            Cmd::Hold(args) => holder::holder(args).await,
            Cmd::Exec(args) => child::exec(args),
        };
        // Dropping the runtime cancels the background releases of dropped leases and of
        // acquisitions cut short (a signal while waiting, "gave up"): let them finish first.
        // Returns at once when there are none.
        if !leasehold::settle(SETTLE).await {
            eprintln!("leasehold: some locks are left to expire by their TTL or session");
        }
        code
    }))
}
