//! `leasehold run`: hold a lock around a command.

use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

use crate::code;
use crate::lock::{Acquiring, Target, obtain, wait_notice};

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    how: Acquiring,
    /// After SIGTERM on a lost lease, wait this long before SIGKILL.
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

    let Some((program, rest)) = args.command.split_first() else {
        return code::USAGE;
    };
    let mut command = Command::new(program);
    command
        .args(rest)
        .env("LEASEHOLD_KEY", &key)
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

    let lost = lease.lost().wait();
    tokio::pin!(lost);
    let forward = |sig: Signal, child: &tokio::process::Child| {
        if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = kill(Pid::from_raw(pid), sig);
        }
    };
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = term.recv() => forward(Signal::SIGTERM, &child),
            _ = int.recv() => forward(Signal::SIGINT, &child),
            reason = &mut lost => {
                eprintln!("leasehold: lease on {key:?} lost ({reason}): stopping the command");
                forward(Signal::SIGTERM, &child);
                match tokio::time::timeout(args.grace, child.wait()).await {
                    Ok(_) => {}
                    Err(_) => {
                        let _ = child.kill().await;
                    }
                }
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
