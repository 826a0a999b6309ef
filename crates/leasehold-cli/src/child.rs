//! The command under `run`'s lock: what it inherits (no credentials), where it runs (a process
//! group of its own, or leasehold's own on an interactive terminal), how it is stopped, and the
//! parent-death signal that makes it die with `leasehold`.
//!
//! `run` does not start the command directly: it starts `leasehold __exec --parent <pid> --
//! COMMAND…`, which asks Linux to SIGKILL it when its parent dies (`PR_SET_PDEATHSIG`, kept across
//! `exec`), checks that the parent is still there, and replaces itself with the command. That
//! way the parent-death signal is set without code between `fork` and `exec` in `run` (the
//! workspace forbids `unsafe`).

use std::io::{self, IsTerminal};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::time::Duration;

use leasehold::redact;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::{Pid, getpgrp, getpid, tcgetpgrp};
use tokio::process::{Child, Command};

use crate::acquire::HOLDER_URL_VAR;
use crate::code;

/// Variables the command never inherits: where the backend is and how to log in to it.
const CREDENTIAL_VARS: &[&str] = &[
    "LEASEHOLD_URL",
    "LEASEHOLD_URLS",
    "LEASEHOLD_BACKEND_USER",
    "LEASEHOLD_BACKEND_PASSWORD",
    HOLDER_URL_VAR,
];

/// Parts of a `LEASEHOLD_*` variable's name that mark it as credential-bearing.
const CREDENTIAL_WORDS: &[&str] = &["PASSWORD", "PASSWD", "SECRET", "TOKEN", "CREDENTIAL", "URL"];

/// Whether the variable `name=value` of our environment may carry a credential of the backend:
/// the configuration's URL and login variables, any `LEASEHOLD_*` name with one of
/// [`CREDENTIAL_WORDS`] in it, and any `LEASEHOLD_*` value the redactor would mask.
pub(crate) fn is_credential(name: &str, value: &str) -> bool {
    if CREDENTIAL_VARS.contains(&name) {
        return true;
    }
    let Some(rest) = name.strip_prefix("LEASEHOLD_") else {
        return false;
    };
    CREDENTIAL_WORDS.iter().any(|w| rest.contains(w)) || redact(value) != value
}

/// Removes every credential-bearing variable ([`is_credential`]) from the command's
/// environment; `LEASEHOLD_FENCING_TOKEN` is set (or removed) by the caller afterwards.
pub(crate) fn scrub_environment(command: &mut Command) {
    for (name, value) in std::env::vars_os() {
        let (Some(n), v) = (name.to_str(), value.to_string_lossy()) else {
            continue;
        };
        if is_credential(n, &v) {
            command.env_remove(&name);
        }
    }
}

/// Where the command runs, and so what a signal from `run` reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Group {
    /// A process group of its own (as `timeout(1)`): a lost lease, `--grace`'s SIGKILL and
    /// forwarded signals reach every process of the command that stayed in it.
    Own,
    /// `leasehold`'s own, when it is the foreground job of a terminal (as `timeout
    /// --foreground`): the terminal's Ctrl-C, Ctrl-Z and reads keep working; signals from
    /// `run` reach the command's own process only.
    Foreground,
}

impl Group {
    /// [`Group::Foreground`] when one of stdin, stdout, stderr is a terminal whose foreground
    /// process group is ours; [`Group::Own`] otherwise (cron, CI, pipes, background jobs).
    pub(crate) fn choose() -> Self {
        let ours = getpgrp();
        let foreground = |fd: std::os::fd::BorrowedFd<'_>| tcgetpgrp(fd).is_ok_and(|g| g == ours);
        let (i, o, e) = (io::stdin(), io::stdout(), io::stderr());
        let interactive = (i.is_terminal() && foreground(i.as_fd()))
            || (o.is_terminal() && foreground(o.as_fd()))
            || (e.is_terminal() && foreground(e.as_fd()));
        if interactive {
            Self::Foreground
        } else {
            Self::Own
        }
    }
}

/// The command `run` spawns: `leasehold __exec --parent <our pid> -- PROGRAM ARGS…`, in its own
/// process group unless `group` says otherwise.
pub(crate) fn command(program: &str, args: &[String], group: Group) -> io::Result<Command> {
    let exe = std::env::current_exe()?;
    let mut command = Command::new(exe);
    command
        .arg("__exec")
        .arg("--parent")
        .arg(getpid().to_string())
        .arg("--")
        .arg(program)
        .args(args);
    if group == Group::Own {
        command.process_group(0);
    }
    Ok(command)
}

/// The running command, as signals see it.
pub(crate) struct Job {
    pid: Pid,
    group: Group,
}

impl Job {
    pub(crate) fn of(child: &Child, group: Group) -> Option<Self> {
        let pid = i32::try_from(child.id()?).ok()?;
        Some(Self {
            pid: Pid::from_raw(pid),
            group,
        })
    }

    /// Sends `sig` to the command's process group (or, in the foreground, to its process).
    pub(crate) fn signal(&self, sig: Signal) {
        let _ = match self.group {
            Group::Own => killpg(self.pid, sig),
            Group::Foreground => kill(self.pid, sig),
        };
    }

    /// Whether no process is left in the command's group (always true in the foreground: the
    /// group is leasehold's own).
    fn group_gone(&self) -> bool {
        self.group == Group::Foreground || killpg(self.pid, None) == Err(Errno::ESRCH)
    }

    /// Stops the command after a lost lease: SIGTERM to it (its group), then SIGKILL once
    /// `grace` has passed with the command, or any process of its group, still there.
    pub(crate) async fn stop(&self, child: &mut Child, grace: Duration) {
        self.signal(Signal::SIGTERM);
        let ended = tokio::time::timeout(grace, async {
            let _ = child.wait().await;
            while !self.group_gone() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        if ended.is_err() {
            // In the foreground only the command's own process is signalled: not once it has
            // been reaped (its pid may be someone else's by now).
            if self.group == Group::Own || matches!(child.try_wait(), Ok(None)) {
                self.signal(Signal::SIGKILL);
            }
            let _ = child.wait().await;
        }
    }
}

/// The flags of `leasehold __exec` (internal): what `run` starts instead of the command.
#[derive(clap::Args)]
pub(crate) struct ExecArgs {
    /// The `leasehold run` process the command must not outlive.
    #[arg(long)]
    parent: i32,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// `leasehold __exec`: sets the parent-death signal (Linux), checks that `run` is still its
/// parent, and replaces itself with the command; returns only when that fails.
pub(crate) fn exec(args: ExecArgs) -> u8 {
    #[cfg(target_os = "linux")]
    {
        if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
            eprintln!("leasehold: cannot set the parent-death signal: {e}");
            return code::CANNOT_RUN;
        }
        // Had `run` died before the line above, nobody would send the signal.
        if nix::unistd::getppid() != Pid::from_raw(args.parent) {
            eprintln!("leasehold: `leasehold run` is gone: the command is not started");
            return code::LOST;
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = args.parent;
    let Some((program, rest)) = args.command.split_first() else {
        return code::USAGE;
    };
    let e = std::process::Command::new(program).args(rest).exec();
    eprintln!("leasehold: cannot run {program:?}: {e}");
    code::CANNOT_RUN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_recognised_by_name_and_by_value() {
        for (n, v) in [
            ("LEASEHOLD_URL", "file:///x"),
            ("LEASEHOLD_URLS", "redis://a,redis://b"),
            ("LEASEHOLD_BACKEND_PASSWORD", "p"),
            ("LEASEHOLD_BACKEND_USER", "u"),
            ("LEASEHOLD_HOLDER_URL", "redis://h"),
            ("LEASEHOLD_ETCD_TOKEN", "t"),
            ("LEASEHOLD_MY_SECRET", "s"),
            ("LEASEHOLD_OTHER", "redis://u:hunter2@h"),
        ] {
            assert!(is_credential(n, v), "{n}={v}");
        }
        for (n, v) in [
            ("LEASEHOLD_TTL", "30s"),
            ("LEASEHOLD_DIR", "/var/lib/locks"),
            ("LEASEHOLD_RUNTIME_DIR", "/run/user/1000/leasehold"),
            ("PATH", "/usr/bin"),
            ("DATABASE_URL", "postgres://u:p@h/db"),
        ] {
            assert!(!is_credential(n, v), "{n}={v}");
        }
    }
}
