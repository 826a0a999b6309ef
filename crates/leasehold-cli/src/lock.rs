//! Which lock, on which backend, and how to acquire it: the flags every subcommand shares, the
//! configuration they name, and the acquisition itself with its exit codes.

use std::path::PathBuf;
use std::time::Duration;

use leasehold::{Error, ErrorKind, Lease, LockConfig, Locker, Semaphore, redact};

use crate::code;

/// After this long without the lock, say on stderr that we wait (unless `--quiet`).
pub(crate) const WAIT_NOTICE: Duration = Duration::from_secs(1);

/// Which lock, on which backend.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct Target {
    /// The name of the lock (or of the election, for `elect` and `leader`); no control
    /// characters.
    #[arg(long, value_parser = cli_key)]
    pub(crate) key: String,
    /// The backend URL (file:///dir, redis://…, redlock://…, postgres://…, etcd://…). Default:
    /// $LEASEHOLD_URL, else a local file lock in the file backend's default folder
    /// ($LEASEHOLD_DIR if set). A password here shows in `ps`: prefer --config or $LEASEHOLD_URL.
    #[arg(long, conflicts_with = "config")]
    pub(crate) url: Option<String>,
    /// A leasehold TOML configuration file (LEASEHOLD_* variables override it).
    #[arg(long)]
    pub(crate) config: Option<PathBuf>,
    /// Take one of N permits of the key (a semaphore) instead of the lock. Every client of a
    /// key must use the same N; a backend without semaphores (Redlock) exits 78.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) permits: Option<u32>,
}

/// Parses `--key`: control characters (a newline, an escape…) are refused, since keys are
/// written to state files, shell assignments and terminals.
pub(crate) fn cli_key(key: &str) -> Result<String, String> {
    match key.chars().find(|c| c.is_control()) {
        Some(c) => Err(format!(
            "a key must not contain control characters (found {:?})",
            c
        )),
        None => Ok(key.to_owned()),
    }
}

/// Says on stderr when `--url` carries a password: command lines are visible to every local
/// user (`ps`), unlike a configuration file or `LEASEHOLD_URL`.
pub(crate) fn warn_if_password_in_url(target: &Target) {
    if let Some(url) = &target.url
        && redact(url) != *url
    {
        eprintln!(
            "leasehold: warning: --url carries a password, which other local users can read in \
             the process list; put it in a --config file or in LEASEHOLD_URL instead"
        );
    }
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

/// The flags of `acquire` and of its holder process.
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct AcquireArgs {
    #[command(flatten)]
    pub(crate) target: Target,
    #[command(flatten)]
    pub(crate) how: Acquiring,
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

/// Builds what the target names: the locker of the lock, or with `--permits` the locker over
/// the backend's permit view (and the semaphore, for its holders).
pub(crate) async fn build(
    target: &Target,
    config: &LockConfig,
) -> Result<(Locker, Option<Semaphore>), Error> {
    match target.permits {
        Some(n) => {
            let sem = config.build_semaphore(n).await?;
            Ok((sem.locker().clone(), Some(sem)))
        }
        None => Ok((config.build().await?, None)),
    }
}

/// Where the lock lives, without secrets: the URL with its passwords masked
/// ([`leasehold::redact`]), the configuration file's path, or the default file-lock folder.
pub(crate) fn location_of(target: &Target) -> String {
    match (&target.config, &target.url) {
        (Some(path), _) => format!(
            "config:{}",
            std::fs::canonicalize(path)
                .unwrap_or_else(|_| path.clone())
                .display()
        ),
        (None, Some(url)) => redact(url),
        (None, None) => {
            let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
            match (var("LEASEHOLD_URL"), var("LEASEHOLD_URLS")) {
                (Some(url), _) => redact(&url),
                (None, Some(urls)) => urls
                    .split(',')
                    .map(|u| redact(u.trim()))
                    .collect::<Vec<_>>()
                    .join(","),
                (None, None) => {
                    format!("file://{}", leasehold::FileConfig::default_dir().display())
                }
            }
        }
    }
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
    let (locker, _) = build(target, &config).await.map_err(fail)?;
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
