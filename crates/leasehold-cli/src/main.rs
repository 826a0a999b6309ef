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
//! ```
//!
//! # `run`
//!
//! The command gets `LEASEHOLD_KEY`, `LEASEHOLD_BACKEND` and, when the backend mints one,
//! `LEASEHOLD_FENCING_TOKEN` in its environment. The lease is renewed while it runs; if it is
//! lost, the command gets SIGTERM, then SIGKILL after `--grace`.
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
//! # Exit status
//!
//! `run` exits with the command's own status (128 + N if a signal N ended it); otherwise:
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success; `status`: the lock is held |
//! | 1 | `status`: the lock is free; `release`: no holder of that key was found |
//! | 2 | bad command line (usage); `release --key`: several live holders (use `--handle`) |
//! | 69 | the backend could not be reached |
//! | 75 | the lock is held by someone else (`--no-wait`) |
//! | 78 | configuration error (bad URL, bad config file, bad key, `require` not met) |
//! | 79 | the lease was lost (`run`: the command was terminated; `release`: it was no longer held) |
//! | 124 | timed out waiting for the lock (`--wait`) |
//! | 126 | the command (or the holder process) could not be started; `acquire` could not print |
//! | 130, 143 | `acquire`, `run`: SIGINT or SIGTERM while waiting for the lock (128 + N) |

mod hold;
mod run;
mod status;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use leasehold::{Error, ErrorKind, Lease, LockConfig, Locker};

/// Exit codes of leasehold itself (see the crate docs).
mod code {
    pub(crate) const FREE: u8 = 1;
    pub(crate) const USAGE: u8 = 2;
    pub(crate) const UNAVAILABLE: u8 = 69;
    pub(crate) const CONTENDED: u8 = 75;
    pub(crate) const CONFIG: u8 = 78;
    pub(crate) const LOST: u8 = 79;
    pub(crate) const TIMEOUT: u8 = 124;
    pub(crate) const CANNOT_RUN: u8 = 126;
    /// 128 + SIGINT: interrupted while acquiring (as shells report it).
    pub(crate) const INTERRUPTED: u8 = 130;
    /// 128 + SIGTERM: terminated while acquiring.
    pub(crate) const TERMINATED: u8 = 143;
}

/// After this long without the lock, say on stderr that we wait (unless `--quiet`).
const WAIT_NOTICE: Duration = Duration::from_secs(1);
/// How long the end of `main` waits for background releases ([`leasehold::settle`]).
const SETTLE: Duration = Duration::from_secs(5);

#[derive(Parser)]
#[command(
    name = "leasehold",
    version,
    about = "Take locks from the shell on any leasehold backend"
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
    Acquire(hold::AcquireArgs),
    /// Tell the holder started by `acquire` to release the lock, and wait for it.
    Release(hold::ReleaseArgs),
    /// Show what the backend can tell about the holder of a lock.
    Status(status::StatusArgs),
    /// The holder process of `acquire` (internal).
    #[command(name = "__hold", hide = true)]
    Hold(hold::AcquireArgs),
}

/// Which lock, on which backend.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct Target {
    /// The lock's name.
    #[arg(long)]
    pub(crate) key: String,
    /// The backend URL (file:///dir, redis://…, redlock://…, postgres://…, etcd://…). Default:
    /// $LEASEHOLD_URL, else a local file lock in $LEASEHOLD_DIR or the temporary folder.
    #[arg(long, conflicts_with = "config")]
    pub(crate) url: Option<String>,
    /// A leasehold TOML configuration file (LEASEHOLD_* variables override it).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
}

/// How to acquire.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct Acquiring {
    /// Lease duration (e.g. 30s); renewed while the lock is held.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) ttl: Option<Duration>,
    /// Wait at most this long for the lock (default: the configuration's wait, 10s).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "no_wait")]
    pub(crate) wait: Option<Duration>,
    /// Fail at once (exit 75) if the lock is held.
    #[arg(long)]
    pub(crate) no_wait: bool,
    /// Say nothing on stderr while waiting.
    #[arg(long)]
    pub(crate) quiet: bool,
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
    ExitCode::from(rt.block_on(async move {
        let code = match cli.command {
            Cmd::Run(args) => run::run(args).await,
            Cmd::Acquire(args) => hold::acquire(args),
            Cmd::Release(args) => hold::release(args).await,
            Cmd::Status(args) => status::status(args).await,
            Cmd::Hold(args) => hold::holder(args).await,
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

/// The exit code for an error of leasehold itself, and the message for stderr.
pub(crate) fn classify(e: &Error) -> u8 {
    match e.kind() {
        ErrorKind::Timeout => code::TIMEOUT,
        ErrorKind::Unavailable | ErrorKind::QuorumNotReached => code::UNAVAILABLE,
        ErrorKind::LeaseLost => code::LOST,
        _ => code::CONFIG,
    }
}

/// Prints the error and returns its exit code.
pub(crate) fn failure(e: &Error) -> u8 {
    eprintln!("leasehold: {e}");
    classify(e)
}

/// The configuration a target names, with the `--ttl` override.
pub(crate) fn config_of(target: &Target, ttl: Option<Duration>) -> Result<LockConfig, Error> {
    let mut config = match (&target.config, &target.url) {
        (Some(path), _) => LockConfig::load(path)?,
        (None, Some(url)) => LockConfig::new(url.clone()),
        // LEASEHOLD_URL (and the other LEASEHOLD_* variables) may name the backend.
        (None, None) => LockConfig::new("file://").with_env()?,
    };
    if let Some(ttl) = ttl {
        config = config.with_ttl(ttl);
    }
    Ok(config)
}

/// Where the lock lives, without secrets: the URL without its user information, the
/// configuration file's path, or the default file-lock folder.
pub(crate) fn location_of(target: &Target) -> String {
    match (&target.config, &target.url) {
        (Some(path), _) => format!(
            "config:{}",
            std::fs::canonicalize(path)
                .unwrap_or_else(|_| path.clone())
                .display()
        ),
        (None, Some(url)) => strip_userinfo(url),
        (None, None) => {
            let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
            match (var("LEASEHOLD_URL"), var("LEASEHOLD_URLS")) {
                (Some(url), _) => strip_userinfo(&url),
                (None, Some(urls)) => urls
                    .split(',')
                    .map(|u| strip_userinfo(u.trim()))
                    .collect::<Vec<_>>()
                    .join(","),
                (None, None) => {
                    format!("file://{}", leasehold::FileConfig::default_dir().display())
                }
            }
        }
    }
}

/// `scheme://user:pw@host,host/db?q&password=x` → `scheme://host,host/db?q`: no user
/// information, no `password=` query parameter.
fn strip_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let rest = match rest[..authority_end].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    let Some((path, query)) = rest.split_once('?') else {
        return format!("{scheme}://{rest}");
    };
    let (query, fragment) = match query.split_once('#') {
        Some((q, f)) => (q, Some(f)),
        None => (query, None),
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| {
            let name = p.split_once('=').map_or(*p, |(n, _)| n);
            !p.is_empty() && !name.eq_ignore_ascii_case("password")
        })
        .collect();
    let mut out = format!("{scheme}://{path}");
    if !kept.is_empty() {
        out.push('?');
        out.push_str(&kept.join("&"));
    }
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}

/// Failure of [`obtain`]: an exit code (the message is already printed or reported).
pub(crate) struct Failed {
    pub(crate) code: u8,
    pub(crate) message: String,
}

/// Builds the locker and acquires the lease as the flags say. `notice` is called once if the
/// lock is not ours after [`WAIT_NOTICE`], with the wait budget; returning `false` gives up.
pub(crate) async fn obtain(
    target: &Target,
    how: &Acquiring,
    notice: impl FnOnce(Duration) -> bool,
) -> Result<(Locker, Lease), Failed> {
    let fail = |e: Error| Failed {
        code: classify(&e),
        message: e.to_string(),
    };
    let config = config_of(target, how.ttl).map_err(fail)?;
    let locker = config.build().await.map_err(fail)?;
    let wait = how.wait.unwrap_or_else(|| config.wait_budget());
    let acquired = if how.no_wait {
        match locker.try_acquire(target.key.as_str()).await {
            Ok(Some(lease)) => Ok(lease),
            Ok(None) => {
                return Err(Failed {
                    code: code::CONTENDED,
                    message: format!("{:?} is held by someone else", target.key),
                });
            }
            Err(e) => Err(e),
        }
    } else {
        let acquire = locker.acquire(target.key.as_str(), wait);
        tokio::pin!(acquire);
        tokio::select! {
            r = &mut acquire => r,
            () = tokio::time::sleep(WAIT_NOTICE) => {
                if !notice(wait) {
                    return Err(Failed { code: 1, message: "gave up".to_owned() });
                }
                acquire.await
            }
        }
    };
    match acquired {
        Ok(lease) => Ok((locker, lease)),
        Err(e) => Err(fail(e)),
    }
}

/// The wait notice printed on stderr.
pub(crate) fn wait_notice(key: &str, wait: Duration) -> String {
    format!(
        "leasehold: waiting up to {} for {key:?}…",
        humantime::format_duration(wait)
    )
}

/// Quotes a value for POSIX shells: `'…'`, with `'` written as `'\''`.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The inverse of [`shell_quote`] for the values it writes.
pub(crate) fn shell_unquote(s: &str) -> String {
    let s = s.trim();
    match s.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        Some(inner) => inner.replace(r"'\''", "'"),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_round_trips() {
        for s in ["plain", "it's", "a b", "'", "", "x'\\''y"] {
            assert_eq!(shell_unquote(&shell_quote(s)), s);
        }
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn userinfo_is_stripped() {
        assert_eq!(
            strip_userinfo("redis://:pw@h:1/0"),
            "redis://h:1/0".to_owned()
        );
        assert_eq!(
            strip_userinfo("redlock://u:p@a:1,b:2,c:3"),
            "redlock://a:1,b:2,c:3"
        );
        assert_eq!(strip_userinfo("etcd://h:1?x=a@b"), "etcd://h:1?x=a@b");
        assert_eq!(strip_userinfo("file:///tmp/x"), "file:///tmp/x");
        assert_eq!(
            strip_userinfo("postgres://h/db?password=s3cret"),
            "postgres://h/db"
        );
        assert_eq!(
            strip_userinfo("postgres://u:a@h/db?sslmode=require&PASSWORD=b&x=1#f"),
            "postgres://h/db?sslmode=require&x=1#f"
        );
    }
}
