//! The holder process of `leasehold acquire` (the hidden `__hold` subcommand).
//!
//! `acquire` spawns `leasehold __hold` (this binary) in a process group of its own, with stderr
//! on `/dev/null` and stdin and stdout pipes to `acquire`. The holder takes the lease and
//! reports on stdout, one line each:
//!
//! - `waiting\t<budget>` when the lock is not ours after a second (`acquire` prints the notice);
//! - `held\t<backend>\t<token or ->\t<pid>\t<handle>` once it holds the lease, or
//! - `error\t<exit code>\t<message>` if it could not.
//!
//! After printing the `held` line's assignments `acquire` writes `ok` on the holder's stdin. A
//! holder whose stdin closes without `ok` (its `acquire` was killed) gives up waiting, or
//! releases the lease if it has it, and exits; so does one that hears nothing for
//! [`HANDSHAKE`] after `held`. Once it holds the lease it writes its record (see
//! [`crate::record`]) and listens on its socket; a `release` there, SIGTERM and SIGINT release
//! the lease; SIGHUP is ignored. If the lease is lost the holder rewrites the state file with
//! `LEASEHOLD_STATE='lost'` and the reason, removes its socket, releases what is left, and
//! exits; `release` then reports the loss.

use std::fs;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::{Lease, Locker};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::watch;

use crate::acquire::HOLDER_URL_VAR;
use crate::code;
use crate::lock::{AcquireArgs, Failed, location_of, obtain};
use crate::record::{
    Answer, MAX_REQUEST_BYTES, RELEASE, State, prepare_runtime_dir, runtime_dir, socket_of,
    sweep_stale,
};

/// How long the holder waits for `acquire`'s `ok` after reporting `held`.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// One line to `acquire`; `false` if it is gone.
fn report(line: &str) -> bool {
    let mut out = io::stdout();
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}

/// Reports an `error` line to `acquire` and returns its code.
fn report_error(code: u8, message: &str) -> u8 {
    report(&format!("error\t{code}\t{message}"));
    code
}

fn clean_message(s: &str) -> String {
    s.replace(['\n', '\t'], " ")
}

/// Reads `acquire`'s one line on stdin in a thread of its own (a blocking read that may never
/// end must not be a runtime task: the runtime would wait for it at exit). `Some(true)` once
/// it reads `ok`, `Some(false)` on anything else, end of file included.
fn watch_stdin() -> watch::Receiver<Option<bool>> {
    let (tx, rx) = watch::channel(None);
    let spawned = std::thread::Builder::new()
        .name("handshake".to_owned())
        .spawn(move || {
            let mut line = String::new();
            let ok = io::stdin().lock().read_line(&mut line).is_ok() && line.trim() == "ok";
            let _ = tx.send(Some(ok));
        });
    if spawned.is_err() {
        // No way to hear `acquire`: treat it as gone rather than hold a lock nobody knows of.
        let (tx, rx) = watch::channel(Some(false));
        drop(tx);
        return rx;
    }
    rx
}

/// Whether `acquire` confirmed with `ok` (waits until it has said something or is gone).
async fn confirmed(rx: &mut watch::Receiver<Option<bool>>) -> bool {
    match rx.wait_for(Option::is_some).await {
        Ok(v) => *v == Some(true),
        Err(_) => false,
    }
}

/// The signals the holder handles: their handlers replace the default actions.
struct Signals {
    term: Signal,
    int: Signal,
    hup: Signal,
}

pub(crate) async fn holder(mut args: AcquireArgs) -> u8 {
    if let Some(url) = std::env::var_os(HOLDER_URL_VAR).and_then(|u| u.into_string().ok()) {
        args.target.url = Some(url);
    }
    // SIGHUP is ignored, SIGTERM and SIGINT release.
    let signals = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    );
    let (Ok(term), Ok(int), Ok(hup)) = signals else {
        return report_error(code::CANNOT_RUN, "cannot install signal handlers");
    };
    let mut signals = Signals { term, int, hup };
    let dir = runtime_dir();
    if let Err(e) = prepare_runtime_dir(&dir) {
        let message = format!(
            "runtime folder {}: {}",
            dir.display(),
            clean_message(&e.to_string())
        );
        return report_error(code::CONFIG, &message);
    }

    let mut ack = watch_stdin();
    let (_locker, lease) = match obtain_unless_stopped(&args, &mut signals, &mut ack).await {
        Ok(v) => v,
        Err(f) => return report_error(f.code, &clean_message(&f.message)),
    };
    match Record::publish(&dir, &args, &lease).await {
        Ok(record) => serve(&lease, record, &mut signals, &mut ack).await,
        Err(code) => code,
    }
}

/// Takes the lease, unless told to stop while still acquiring or `acquire` is gone: then gives
/// up (the acquisition cut short is cleaned up before the process ends, see main).
async fn obtain_unless_stopped(
    args: &AcquireArgs,
    signals: &mut Signals,
    ack: &mut watch::Receiver<Option<bool>>,
) -> Result<(Locker, Lease), Failed> {
    let obtained = obtain(&args.target, &args.how, |wait| {
        report(&format!("waiting\t{}", humantime::format_duration(wait)))
    });
    let gone = async {
        if confirmed(ack).await {
            // `ok` before `held` is not the protocol; keep waiting for the lease regardless.
            std::future::pending::<()>().await;
        }
    };
    let stopped = |code, message: &str| {
        Err(Failed {
            code,
            message: message.to_owned(),
        })
    };
    tokio::select! {
        o = obtained => o,
        _ = signals.term.recv() => stopped(code::TERMINATED, "stopped by SIGTERM"),
        _ = signals.int.recv() => stopped(code::INTERRUPTED, "stopped by SIGINT"),
        () = gone => stopped(code::CANNOT_RUN, "acquire is gone"),
    }
}

/// A holder's published record: its state file (the handle), its socket, and what the state
/// file says.
struct Record {
    state: State,
    state_path: PathBuf,
    sock_path: PathBuf,
    listener: UnixListener,
}

impl Record {
    /// Listens on the socket, writes the state file, sweeps stale records of the same lock and
    /// reports `held`. On failure the lease is given back and the exit code returned.
    async fn publish(dir: &Path, args: &AcquireArgs, lease: &Lease) -> Result<Self, u8> {
        let pid = std::process::id();
        let mut state_path = dir.join(format!("{pid}.state"));
        if state_path.exists() {
            // A record kept from an earlier holder with the same (reused) pid: do not take it
            // over.
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            state_path = dir.join(format!("{pid}-{nanos}.state"));
        }
        let sock_path = socket_of(&state_path);
        let _ = fs::remove_file(&sock_path);
        let listener = match UnixListener::bind(&sock_path) {
            Ok(l) => l,
            Err(e) => {
                let _ = lease.release().await;
                return Err(report_failure("listen on", &sock_path, &e));
            }
        };
        let location = location_of(&args.target);
        let state = State::held(&args.target.key, &location, lease, pid);
        let record = Self {
            state,
            state_path,
            sock_path,
            listener,
        };
        if let Err(e) = record.state.write(&record.state_path) {
            let _ = lease.release().await;
            record.remove(true);
            return Err(report_failure("write", &record.state_path, &e));
        }
        // Records of other holds of this lock stay until their own `release` reads them (a lost
        // hold's owner must learn of the loss); only those left for more than a day go.
        sweep_stale(dir, &args.target.key, &location, &record.state_path);
        let token = lease.fencing_token().map(|t| t.get().to_string());
        let held = format!(
            "held\t{}\t{}\t{pid}\t{}",
            lease.backend_name(),
            token.as_deref().unwrap_or("-"),
            record.state_path.display()
        );
        if !report(&held) {
            // Nobody learnt we hold it: give it back.
            let _ = lease.release().await;
            record.remove(true);
            return Err(1);
        }
        Ok(record)
    }

    /// Removes the socket, and the state file if `with_state`.
    fn remove(&self, with_state: bool) {
        let _ = fs::remove_file(&self.sock_path);
        if with_state {
            let _ = fs::remove_file(&self.state_path);
        }
    }
}

/// Reports that the holder cannot `what` `path` (`cannot write …: <error>`): exit 126.
fn report_failure(what: &str, path: &Path, e: &io::Error) -> u8 {
    let message = format!(
        "cannot {what} {}: {}",
        path.display(),
        clean_message(&e.to_string())
    );
    report_error(code::CANNOT_RUN, &message)
}

/// Holds the lease until `release`, a signal, the loss of the lease, or a missing handshake.
async fn serve(
    lease: &Lease,
    mut record: Record,
    signals: &mut Signals,
    ack: &mut watch::Receiver<Option<bool>>,
) -> u8 {
    let lost = lease.lost().wait();
    tokio::pin!(lost);
    let handshake_until = tokio::time::Instant::now() + HANDSHAKE;
    let mut is_confirmed = false;
    loop {
        tokio::select! {
            reason = &mut lost => {
                // The record first, then the socket: a `release` that finds no socket reads
                // the state file and reports the loss.
                record.state.lose(clean_message(&reason.to_string()));
                record.remove(record.state.write(&record.state_path).is_err());
                // Whatever is left (a Redlock minority, say); bounded.
                let _ = tokio::time::timeout(Duration::from_secs(5), lease.release()).await;
                return code::LOST;
            }
            ok = tokio::time::timeout_at(handshake_until, confirmed(ack)), if !is_confirmed => {
                if matches!(ok, Ok(true)) {
                    is_confirmed = true;
                } else {
                    // `acquire` died before printing the handle: nobody can release this.
                    let _ = release_and_exit(lease, &record).await;
                    return code::CANNOT_RUN;
                }
            }
            _ = signals.term.recv() => return release_and_exit(lease, &record).await.1,
            _ = signals.int.recv() => return release_and_exit(lease, &record).await.1,
            _ = signals.hup.recv() => {}
            conn = record.listener.accept() => {
                let Ok((stream, _)) = conn else { continue };
                if let Some(code) = answer(stream, lease, &record).await {
                    return code;
                }
            }
        }
    }
}

/// Answers one connection on the socket; the exit code once it released the lease.
async fn answer(stream: UnixStream, lease: &Lease, record: &Record) -> Option<u8> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = tokio::io::BufReader::new(read.take(MAX_REQUEST_BYTES));
    let got = tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line)).await;
    if !matches!(got, Ok(Ok(_))) {
        return None;
    }
    match line.trim() {
        RELEASE => {
            let (answer, code) = release_and_exit(lease, record).await;
            let _ = write
                .write_all(format!("{}\n", answer.line()).as_bytes())
                .await;
            let _ = write.shutdown().await;
            Some(code)
        }
        _ => {
            let _ = write.write_all(b"error\tunknown request\n").await;
            None
        }
    }
}

/// Releases the lease and removes the record; the answer for `release` and the exit code.
async fn release_and_exit(lease: &Lease, record: &Record) -> (Answer, u8) {
    let outcome = lease.release().await;
    record.remove(true);
    match outcome {
        Ok(true) => (Answer::Released, 0),
        Ok(false) => (Answer::NotHeld, code::LOST),
        Err(e) => (Answer::Failed(e.to_string()), code::UNAVAILABLE),
    }
}
