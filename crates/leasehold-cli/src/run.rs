//! `leasehold run`: hold a lock around a command.

use std::io;
use std::time::Duration;

use leasehold::Lease;
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

pub(crate) async fn run(args: RunArgs) -> u8 {
    let key = args.target.key.clone();
    let quiet = args.how.quiet;
    // From here on SIGTERM and SIGINT are ours: while acquiring they give up (the acquisition
    // cut short is cleaned up before exiting, see main), while the command runs they are
    // passed on to it.
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("leasehold: cannot install signal handlers");
        return code::CANNOT_RUN;
    };
    warn_if_password_in_url(&args.target);
    let obtained = obtain(&args.target, &args.how, |wait| {
        if !quiet {
            eprintln!("{}", wait_notice(&key, wait));
        }
        true
    });
    let obtained = tokio::select! {
        o = obtained => o,
        _ = term.recv() => {
            eprintln!("leasehold: stopped by SIGTERM while acquiring {key:?}");
            return code::TERMINATED;
        }
        _ = int.recv() => {
            eprintln!("leasehold: stopped by SIGINT while acquiring {key:?}");
            return code::INTERRUPTED;
        }
    };
    let (_locker, lease) = match obtained {
        Ok(v) => v,
        Err(f) => {
            eprintln!("leasehold: {}", f.message);
            return f.code;
        }
    };

    let group = Group::choose();
    let (mut child, job) = match start(&args, &lease, group) {
        Ok(started) => started,
        Err(e) => {
            let program = args.command.first().map_or("", String::as_str);
            eprintln!("leasehold: cannot run {program:?}: {e}");
            let _ = lease.release().await;
            return code::CANNOT_RUN;
        }
    };

    let lost = lease.lost().wait();
    tokio::pin!(lost);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = term.recv() => job.signal(Signal::SIGTERM),
            _ = int.recv() => job.signal(Signal::SIGINT),
            reason = &mut lost => {
                eprintln!("leasehold: lease on {key:?} lost ({reason}): stopping the command");
                job.stop(&mut child, args.grace).await;
                let _ = lease.release().await;
                return code::LOST;
            }
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

/// Starts the command (through `leasehold __exec`, see [`child`]) with the lease in its
/// environment and no credentials.
fn start(args: &RunArgs, lease: &Lease, group: Group) -> io::Result<(Child, Job)> {
    let Some((program, rest)) = args.command.split_first() else {
        return Err(io::Error::other("no command"));
    };
    let mut command = child::command(program, rest, group)?;
    child::scrub_environment(&mut command);
    command
        .env("LEASEHOLD_KEY", &args.target.key)
        .env("LEASEHOLD_BACKEND", lease.backend_name())
        .env("LEASEHOLD_LOCATION", location_of(&args.target));
    match lease.fencing_token() {
        Some(t) => command.env("LEASEHOLD_FENCING_TOKEN", t.get().to_string()),
        None => command.env_remove("LEASEHOLD_FENCING_TOKEN"),
    };
    let child = command.spawn()?;
    let job = Job::of(&child, group).ok_or_else(|| io::Error::other("the command has no pid"))?;
    Ok((child, job))
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
