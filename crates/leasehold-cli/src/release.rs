//! `leasehold release`: find the holder started by `acquire`, ask it to release, and wait
//! until it has exited.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::code;
use crate::lock::cli_key;
use crate::lock::{Target, location_of};
use crate::record::{
    Answer, HANDLE_VAR, RELEASE, RUNTIME_DIR_VAR, State, alive, ask, remove_record, runtime_dir,
    socket_of, states, verify_handle, verify_runtime_dir,
};

#[derive(clap::Args, Debug)]
pub(crate) struct ReleaseArgs {
    /// The lock's name: release the holder of this key (with --url/--config when several
    /// backends have one). Without --key and --handle, $LEASEHOLD_HANDLE is used.
    #[arg(long, conflicts_with = "handle", value_parser = cli_key)]
    key: Option<String>,
    /// Only the holder of --key on this backend URL.
    #[arg(long, requires = "key", conflicts_with = "config")]
    url: Option<String>,
    /// Only the holder of --key from this configuration file.
    #[arg(long, requires = "key")]
    config: Option<PathBuf>,
    /// Accepted for symmetry with `acquire --permits`: a permit's holder is found by key (and
    /// backend) like a lock's.
    #[arg(long, requires = "key", value_parser = clap::value_parser!(u32).range(1..=1024))]
    permits: Option<u32>,
    /// The state file printed by `acquire` as LEASEHOLD_HANDLE: a `<pid>.state` file of ours
    /// in a private runtime folder of ours; anything else is refused and left alone.
    #[arg(long)]
    handle: Option<PathBuf>,
    /// Give up waiting for the holder's answer after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    timeout: Duration,
}

pub(crate) async fn release(args: ReleaseArgs) -> u8 {
    let handle = match (&args.handle, &args.key) {
        (Some(h), _) => h.clone(),
        (None, Some(key)) => match find_by_key(&args, key) {
            Ok(h) => h,
            Err(code) => return code,
        },
        (None, None) => match std::env::var_os(HANDLE_VAR).filter(|h| !h.is_empty()) {
            Some(h) => PathBuf::from(h),
            None => {
                eprintln!("leasehold: release needs --key or --handle (or {HANDLE_VAR} set)");
                return code::USAGE;
            }
        },
    };
    let state = match read_handle(&handle) {
        Ok(s) => s,
        Err(c) => return c,
    };
    if state.is_lost() {
        return report_ended(&handle, &state);
    }
    let sock = socket_of(&handle);
    let timeout = args.timeout;
    let answer = tokio::task::spawn_blocking(move || ask(&sock, RELEASE, timeout)).await;
    let answer = match answer {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            // The holder may have been busy losing the lease: the state file says.
            let state = match read_handle(&handle) {
                Ok(s) => s,
                Err(c) => return c,
            };
            if !state.has_ended() {
                eprintln!(
                    "leasehold: the holder (pid {}) of {:?} does not answer: {e}",
                    state.pid(),
                    state.key()
                );
                return code::UNAVAILABLE;
            }
            return report_ended(&handle, &state);
        }
        Err(e) => {
            eprintln!("leasehold: {e}");
            return code::UNAVAILABLE;
        }
    };
    // The holder exits right after answering.
    let t0 = Instant::now();
    while alive(state.pid()) && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match Answer::parse(&answer) {
        Answer::Released => 0,
        Answer::NotHeld => {
            eprintln!(
                "leasehold: the lease on {:?} was no longer held when released",
                state.key()
            );
            code::LOST
        }
        Answer::Failed(msg) => {
            eprintln!("leasehold: release of {:?} failed: {msg}", state.key());
            code::UNAVAILABLE
        }
    }
}

/// The handle of the one live holder of `key` (narrowed by `--url`/`--config`), or the exit
/// code: a lost or dead hold of it is reported first (79), none is 1, several are 2.
fn find_by_key(args: &ReleaseArgs, key: &str) -> Result<PathBuf, u8> {
    let dir = runtime_dir();
    match verify_runtime_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            eprintln!(
                "leasehold: no holder of {key:?}: no runtime folder {}",
                dir.display()
            );
            return Err(code::FREE);
        }
        Err(e) => {
            eprintln!("leasehold: runtime folder: {e} (set {RUNTIME_DIR_VAR})");
            return Err(code::CONFIG);
        }
    }
    let location = (args.url.is_some() || args.config.is_some()).then(|| {
        location_of(&Target {
            key: key.to_owned(),
            url: args.url.clone(),
            config: args.config.clone(),
            permits: args.permits,
        })
    });
    let found: Vec<(PathBuf, State)> = states(&dir)
        .into_iter()
        .filter(|(_, s)| s.is_of(key, location.as_deref()))
        .collect();
    // A hold that was lost, or whose holder died, is reported (and its record consumed) before
    // any live holder is touched: its owner is the likelier caller, and releasing someone
    // else's live lock mid-work is the worse mistake.
    let (ended, live): (Vec<_>, Vec<_>) = found.into_iter().partition(|(_, s)| s.has_ended());
    if let Some((path, state)) = State::oldest(ended) {
        return Err(report_ended(&path, &state));
    }
    match live.as_slice() {
        [] => {
            eprintln!(
                "leasehold: no holder of {key:?} in {} (was it acquired with another {RUNTIME_DIR_VAR}?)",
                dir.display()
            );
            Err(code::FREE)
        }
        [(one, _)] => Ok(one.clone()),
        many => {
            eprintln!(
                "leasehold: several live holders of {key:?}; say which with --handle (or --url/--config):"
            );
            for (p, _) in many {
                eprintln!("  {}", p.display());
            }
            Err(code::USAGE)
        }
    }
}

/// Reads a handle; an exit code when it cannot (1 when there is none: already released).
fn read_handle(handle: &Path) -> Result<State, u8> {
    // A missing folder is reported below, as a missing file is: already released.
    if let Err(e) = verify_handle(handle)
        && e.kind() != io::ErrorKind::NotFound
    {
        eprintln!("leasehold: refusing the handle: {e}");
        return Err(code::CONFIG);
    }
    match State::read(handle) {
        Ok(s) => Ok(s),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            eprintln!(
                "leasehold: no holder at {} (already released?)",
                handle.display()
            );
            Err(code::FREE)
        }
        Err(e) => {
            eprintln!("leasehold: cannot read {}: {e}", handle.display());
            Err(code::CONFIG)
        }
    }
}

/// Reports a hold that ended without `release` (lost, or its holder died) and consumes its
/// record: exit 79.
fn report_ended(handle: &Path, state: &State) -> u8 {
    eprintln!("leasehold: {}", state.end_notice());
    remove_record(handle);
    code::LOST
}
