//! `leasehold run`: hold a lock around a command. The pieces `elect` shares with it: the
//! signals, starting the command under a lease, watching it until it ends or the lease is lost.

use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use leasehold::{Lease, LossReason};
use nix::sys::signal::Signal;
use tokio::process::Child;
use tokio::signal::unix::{SignalKind, signal};

use crate::child::{self, Group, Job};
use crate::code;
use crate::lock::{Acquiring, Target, location_of, obtain, wait_notice, warn_if_password_in_url};

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    how: Acquiring,
    /// After SIGTERM on a lost lease, wait this long for the command (and its process group)
    /// to end before SIGKILL.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    grace: Duration,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// SIGTERM and SIGINT, taken over from the default action (which would kill `leasehold`
/// and leave its lease to expire).
pub(crate) struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    /// Whether one was received and passed on to the command.
    pub(crate) forwarded: bool,
}

impl Signals {
    /// Installs the handlers, or prints why not.
    pub(crate) fn install() -> Option<Self> {
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Some(Self {
                term,
                int,
                forwarded: false,
            }),
            _ => {
                eprintln!("leasehold: cannot install signal handlers");
                None
            }
        }
    }

    /// Waits for SIGTERM or SIGINT, and returns the exit code for giving up on it
    /// (143 or 130), having said so on stderr: `doing` is what was given up.
    pub(crate) async fn give_up(&mut self, doing: &str) -> u8 {
        tokio::select! {
            _ = self.term.recv() => {
                eprintln!("leasehold: stopped by SIGTERM while {doing}");
                code::TERMINATED
            }
            _ = self.int.recv() => {
                eprintln!("leasehold: stopped by SIGINT while {doing}");
                code::INTERRUPTED
            }
        }
    }
}

/// How watching a command under a lease ended.
pub(crate) enum Outcome {
    /// The command ended (or waiting for it failed); the lease may still be held.
    Ended(io::Result<ExitStatus>),
    /// The lease was lost: the command still runs, the caller stops it.
    Lost(LossReason),
}

/// Waits until the command ends or `lease` is lost, passing SIGTERM and SIGINT on to the
/// command meanwhile.
pub(crate) async fn supervise(
    child: &mut Child,
    job: &Job,
    lease: &Lease,
    signals: &mut Signals,
) -> Outcome {
    let lost = lease.lost().wait();
    tokio::pin!(lost);
    loop {
        tokio::select! {
            status = child.wait() => return Outcome::Ended(status),
            _ = signals.term.recv() => {
                signals.forwarded = true;
                job.signal(Signal::SIGTERM);
            }
            _ = signals.int.recv() => {
                signals.forwarded = true;
                job.signal(Signal::SIGINT);
            }
            reason = &mut lost => return Outcome::Lost(reason),
        }
    }
}

pub(crate) async fn run(args: RunArgs) -> u8 {
    let key = args.target.key.clone();
    let quiet = args.how.quiet;
    // From here on SIGTERM and SIGINT are ours: while acquiring they give up (the acquisition
    // cut short is cleaned up before exiting, see main), while the command runs they are
    // passed on to it.
    let Some(mut signals) = Signals::install() else {
        return code::CANNOT_RUN;
    };
    warn_if_password_in_url(&args.target);
    let obtained = obtain(&args.target, &args.how, |wait| {
        if !quiet {
            eprintln!("{}", wait_notice(&key, wait));
        }
        true
    });
    let acquiring = format!("acquiring {key:?}");
    let obtained = tokio::select! {
        o = obtained => o,
        code = signals.give_up(&acquiring) => return code,
    };
    let (_locker, lease) = match obtained {
        Ok(v) => v,
        Err(f) => {
            eprintln!("leasehold: {}", f.message);
            return f.code;
        }
    };

    let (mut child, job) = match start(&args.target, &args.command, &lease, &[]) {
        Ok(started) => started,
        Err(code) => {
            let _ = lease.release().await;
            return code;
        }
    };
    match supervise(&mut child, &job, &lease, &mut signals).await {
        Outcome::Lost(reason) => {
            eprintln!("leasehold: lease on {key:?} lost ({reason}): stopping the command");
            job.stop(&mut child, args.grace).await;
            let _ = lease.release().await;
            code::LOST
        }
        Outcome::Ended(status) => {
            if let Err(e) = lease.release().await {
                eprintln!("leasehold: release failed ({e}); the lock ends by its TTL or session");
            }
            exit_code_of(status)
        }
    }
}

/// Starts the command (through `leasehold __exec`, see [`child`]) in the group
/// [`Group::choose`] picks, with the lease and `extra` in its environment and no credentials.
/// On failure, says why on stderr and returns the exit code (126).
pub(crate) fn start(
    target: &Target,
    command: &[String],
    lease: &Lease,
    extra: &[(&str, String)],
) -> Result<(Child, Job), u8> {
    let group = Group::choose();
    let spawned = (|| {
        let Some((program, rest)) = command.split_first() else {
            return Err(io::Error::other("no command"));
        };
        let mut command = child::command(program, rest, group)?;
        child::scrub_environment(&mut command);
        command
            .env("LEASEHOLD_KEY", &target.key)
            .env("LEASEHOLD_BACKEND", lease.backend_name())
            .env("LEASEHOLD_LOCATION", location_of(target));
        match lease.fencing_token() {
            Some(t) => command.env("LEASEHOLD_FENCING_TOKEN", t.get().to_string()),
            None => command.env_remove("LEASEHOLD_FENCING_TOKEN"),
        };
        command.envs(extra.iter().map(|(k, v)| (k, v)));
        let child = command.spawn()?;
        let job =
            Job::of(&child, group).ok_or_else(|| io::Error::other("the command has no pid"))?;
        Ok((child, job))
    })();
    spawned.map_err(|e| {
        let program = command.first().map_or("", String::as_str);
        eprintln!("leasehold: cannot run {program:?}: {e}");
        code::CANNOT_RUN
    })
}

/// The command's exit code, or 128 + the signal that ended it (as shells do); 126 when
/// waiting for it failed.
pub(crate) fn exit_code_of(status: io::Result<ExitStatus>) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    let status = match status {
        Ok(s) => s,
        Err(e) => {
            eprintln!("leasehold: waiting for the command failed: {e}");
            return code::CANNOT_RUN;
        }
    };
    if let Some(c) = status.code() {
        return u8::try_from(c).unwrap_or(1);
    }
    status
        .signal()
        .and_then(|s| u8::try_from(128 + s).ok())
        .unwrap_or(1)
}
