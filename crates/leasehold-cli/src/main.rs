//! `leasehold`: run a command while holding a lock, like `flock(1)` or `etcdctl lock`, on any
//! leasehold backend.
//!
//! ```text
//! leasehold run --key nightly -- ./job.sh                          # local file lock, no setup
//! leasehold run --key nightly --url postgres://… --wait 30s -- ./job.sh
//! leasehold run --key nightly --config /etc/app/locks.toml --no-wait -- ./job.sh
//! ```
//!
//! The command gets `LEASEHOLD_KEY`, `LEASEHOLD_BACKEND` and, when the backend mints one,
//! `LEASEHOLD_FENCING_TOKEN` in its environment. The lease is renewed while it runs; if it is
//! lost, the command gets SIGTERM, then SIGKILL after `--grace`.
//!
//! Exit status: the command's own (128 + N if a signal N ended it), or one of leasehold's:
//!
//! | code | meaning |
//! |---|---|
//! | 2 | bad command line (usage) |
//! | 69 | the backend could not be reached |
//! | 75 | the lock is held by someone else (`--no-wait`) |
//! | 78 | configuration error (bad URL, bad config file, `require` not met) |
//! | 79 | the lease was lost while the command ran; the command was terminated |
//! | 124 | timed out waiting for the lock (`--wait`) |
//! | 126 | the command could not be started |

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use leasehold::{Error, ErrorKind, LockConfig};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Command;

/// Exit codes of leasehold itself (see the crate docs).
mod code {
    pub(crate) const UNAVAILABLE: u8 = 69;
    pub(crate) const CONTENDED: u8 = 75;
    pub(crate) const CONFIG: u8 = 78;
    pub(crate) const LOST: u8 = 79;
    pub(crate) const TIMEOUT: u8 = 124;
    pub(crate) const CANNOT_RUN: u8 = 126;
}

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Run commands under a lock held on any leasehold backend"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Acquire the lock, run the command while renewing it, release it.
    Run(RunArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// The lock's name.
    #[arg(long)]
    key: String,
    /// The backend URL (file:///dir, redis://…, postgres://…, etcd://…). Default: a local
    /// file lock in $LEASEHOLD_DIR or the temporary folder.
    #[arg(long, conflicts_with = "config")]
    url: Option<String>,
    /// A leasehold TOML configuration file (LEASEHOLD_* variables override it).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Lease duration (e.g. 30s); renewed while the command runs.
    #[arg(long, value_parser = humantime::parse_duration)]
    ttl: Option<Duration>,
    /// Wait at most this long for the lock (default: the configuration's wait, 10s).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Fail at once (exit 75) if the lock is held.
    #[arg(long)]
    no_wait: bool,
    /// After SIGTERM on a lost lease, wait this long before SIGKILL.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    grace: Duration,
    /// Say nothing on stderr while waiting.
    #[arg(long)]
    quiet: bool,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    match cli.command {
        Cmd::Run(args) => ExitCode::from(rt.block_on(run(args))),
    }
}

/// The exit code for an error of leasehold itself.
fn failure(e: &Error) -> u8 {
    eprintln!("leasehold: {e}");
    match e.kind() {
        ErrorKind::Timeout => code::TIMEOUT,
        ErrorKind::Unavailable | ErrorKind::QuorumNotReached => code::UNAVAILABLE,
        ErrorKind::LeaseLost => code::LOST,
        _ => code::CONFIG,
    }
}

async fn run(args: RunArgs) -> u8 {
    let config = match (&args.config, &args.url) {
        (Some(path), _) => LockConfig::load(path).and_then(LockConfig::with_env),
        (None, Some(url)) => Ok(LockConfig::new(url.clone())),
        (None, None) => Ok(LockConfig::new("file://")),
    };
    let mut config = match config {
        Ok(c) => c,
        Err(e) => return failure(&e),
    };
    if let Some(ttl) = args.ttl {
        config = config.with_ttl(ttl);
    }
    let locker = match config.build().await {
        Ok(l) => l,
        Err(e) => return failure(&e),
    };
    let wait = args.wait.unwrap_or_else(|| config.wait_budget());

    let acquired = if args.no_wait {
        match locker.try_acquire(args.key.as_str()).await {
            Ok(Some(lease)) => Ok(lease),
            Ok(None) => {
                eprintln!("leasehold: {:?} is held by someone else", args.key);
                return code::CONTENDED;
            }
            Err(e) => Err(e),
        }
    } else {
        let acquire = locker.acquire(args.key.as_str(), wait);
        tokio::pin!(acquire);
        tokio::select! {
            r = &mut acquire => r,
            () = tokio::time::sleep(Duration::from_secs(1)) => {
                if !args.quiet {
                    eprintln!("leasehold: waiting up to {wait:?} for {:?}…", args.key);
                }
                acquire.await
            }
        }
    };
    let lease = match acquired {
        Ok(l) => l,
        Err(e) => return failure(&e),
    };

    let Some((program, rest)) = args.command.split_first() else {
        return 2;
    };
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("LEASEHOLD_KEY", &args.key)
        .env("LEASEHOLD_BACKEND", lease.backend_name());
    match lease.fencing_token() {
        Some(t) => command.env("LEASEHOLD_FENCING_TOKEN", t.get().to_string()),
        None => command.env_remove("LEASEHOLD_FENCING_TOKEN"),
    };
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("leasehold: cannot run {program:?}: {e}");
            let _ = lease.release().await;
            return code::CANNOT_RUN;
        }
    };

    let lost = lease.lost();
    let status = tokio::select! {
        status = child.wait() => status,
        reason = lost.wait() => {
            eprintln!("leasehold: lease on {:?} lost ({reason}): stopping the command", args.key);
            if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
            match tokio::time::timeout(args.grace, child.wait()).await {
                Ok(_) => {}
                Err(_) => {
                    let _ = child.kill().await;
                }
            }
            let _ = lease.release().await;
            return code::LOST;
        }
    };
    if let Err(e) = lease.release().await {
        eprintln!("leasehold: release failed ({e}); the lock ends by its TTL or session");
    }
    match status {
        Ok(s) => exit_code_of(s),
        Err(e) => {
            eprintln!("leasehold: waiting for the command failed: {e}");
            code::CANNOT_RUN
        }
    }
}

/// The command's exit code, or 128 + the signal that ended it (as shells do).
fn exit_code_of(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    if let Some(c) = status.code() {
        return u8::try_from(c).unwrap_or(1);
    }
    status
        .signal()
        .and_then(|s| u8::try_from(128 + s).ok())
        .unwrap_or(1)
}
