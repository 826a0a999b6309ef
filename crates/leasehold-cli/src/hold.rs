//! `leasehold acquire` / `release`: a lock held across shell commands by a holder process.
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
//! [`HANDSHAKE`] after `held`. Once it holds the lease it writes a state file
//! `<runtime dir>/<pid>.state` (the handle) and listens on `<runtime dir>/<pid>.sock`; `release` sends `release` there and gets
//! back `released`, `not-held` or `error\t<message>`. SIGTERM and SIGINT release too; SIGHUP is
//! ignored. If the lease is lost the holder rewrites the state file with
//! `LEASEHOLD_STATE='lost'` and the reason, removes its socket, releases what is left, and
//! exits; `release` then reports the loss. Records of lost holds and dead holders stay until
//! their `release` consumes them (a later `acquire` of the same lock sweeps those older than
//! [`STALE_AFTER`]); a holder never removes another's record.

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold::Lease;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::{
    Acquiring, Failed, Target, code, location_of, obtain, shell_quote, shell_unquote, wait_notice,
};

/// The folder of state files and sockets, if set.
pub(crate) const RUNTIME_DIR_VAR: &str = "LEASEHOLD_RUNTIME_DIR";
/// The handle `release` uses when given no `--key` nor `--handle`.
pub(crate) const HANDLE_VAR: &str = "LEASEHOLD_HANDLE";
/// How `acquire` hands the URL to the holder: not on its command line, where `ps` shows it.
const HOLDER_URL_VAR: &str = "LEASEHOLD_HOLDER_URL";

#[derive(clap::Args, Clone, Debug)]
pub(crate) struct AcquireArgs {
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    how: Acquiring,
}

#[derive(clap::Args, Debug)]
pub(crate) struct ReleaseArgs {
    /// The lock's name: release the holder of this key (with --url/--config when several
    /// backends have one). Without --key and --handle, $LEASEHOLD_HANDLE is used.
    #[arg(long, conflicts_with = "handle")]
    key: Option<String>,
    /// Only the holder of --key on this backend URL.
    #[arg(long, requires = "key", conflicts_with = "config")]
    url: Option<String>,
    /// Only the holder of --key from this configuration file.
    #[arg(long, requires = "key")]
    config: Option<PathBuf>,
    /// The state file printed by `acquire` as LEASEHOLD_HANDLE.
    #[arg(long)]
    handle: Option<PathBuf>,
    /// Give up waiting for the holder's answer after this long.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    timeout: Duration,
}

/// The runtime folder: `$LEASEHOLD_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/leasehold`, else
/// `leasehold-<uid>` in the temporary folder.
pub(crate) fn runtime_dir() -> PathBuf {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(d) = var(RUNTIME_DIR_VAR) {
        // Absolute: handles name files in it, and `release` may run from another folder.
        let d = PathBuf::from(d);
        return std::path::absolute(&d).unwrap_or(d);
    }
    if let Some(d) = var("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("leasehold");
    }
    std::env::temp_dir().join(format!("leasehold-{}", nix::unistd::getuid()))
}

/// Creates the runtime folder (mode 0700) and checks that it is a folder (not a symbolic link),
/// ours and private; refuses it otherwise (a folder others can write to is not fixed silently).
fn prepare_runtime_dir(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(dir)?;
    if !meta.file_type().is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a folder (a symbolic link or a file)",
            dir.display()
        )));
    }
    if meta.uid() != nix::unistd::getuid().as_raw() {
        return Err(io::Error::other(format!(
            "{} belongs to another user",
            dir.display()
        )));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(io::Error::other(format!(
            "{} is open to other users (mode {mode:o}; make it 0700)",
            dir.display()
        )));
    }
    Ok(())
}

/// What a state file says.
#[derive(Debug, Default, Clone)]
struct State {
    state: String,
    key: String,
    backend: String,
    location: String,
    owner: String,
    token: Option<String>,
    pid: u32,
    acquired_at: u64,
    lost_reason: Option<String>,
}

impl State {
    fn render(&self) -> String {
        let mut s = String::new();
        let mut line = |k: &str, v: &str| {
            s.push_str(&format!("LEASEHOLD_{k}={}\n", shell_quote(v)));
        };
        line("STATE", &self.state);
        line("KEY", &self.key);
        line("BACKEND", &self.backend);
        line("LOCATION", &self.location);
        line("OWNER", &self.owner);
        if let Some(t) = &self.token {
            line("FENCING_TOKEN", t);
        }
        line("HOLDER_PID", &self.pid.to_string());
        line("ACQUIRED_AT", &self.acquired_at.to_string());
        if let Some(r) = &self.lost_reason {
            line("LOST_REASON", r);
        }
        s
    }

    fn parse(text: &str) -> Self {
        let mut st = Self::default();
        for line in text.lines() {
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            let v = shell_unquote(v);
            match k.trim() {
                "LEASEHOLD_STATE" => st.state = v,
                "LEASEHOLD_KEY" => st.key = v,
                "LEASEHOLD_BACKEND" => st.backend = v,
                "LEASEHOLD_LOCATION" => st.location = v,
                "LEASEHOLD_OWNER" => st.owner = v,
                "LEASEHOLD_FENCING_TOKEN" => st.token = Some(v),
                "LEASEHOLD_HOLDER_PID" => st.pid = v.parse().unwrap_or(0),
                "LEASEHOLD_ACQUIRED_AT" => st.acquired_at = v.parse().unwrap_or(0),
                "LEASEHOLD_LOST_REASON" => st.lost_reason = Some(v),
                _ => {}
            }
        }
        st
    }

    fn read(path: &Path) -> io::Result<Self> {
        Ok(Self::parse(&fs::read_to_string(path)?))
    }

    /// Writes the file atomically (a temporary file renamed over it).
    fn write(&self, path: &Path) -> io::Result<()> {
        let tmp = path.with_extension("state.tmp");
        {
            // A stale one (or a symbolic link planted there) goes; `create_new` neither
            // follows a link nor reuses a file.
            match fs::remove_file(&tmp) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(self.render().as_bytes())?;
            f.sync_all()?;
        }
        fs::rename(&tmp, path)
    }
}

fn socket_of(state: &Path) -> PathBuf {
    state.with_extension("sock")
}

/// Every state file in the runtime folder, with what it says.
fn states(dir: &Path) -> Vec<(PathBuf, State)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, State)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "state"))
        .filter_map(|p| State::read(&p).ok().map(|s| (p, s)))
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// Whether process `pid` is alive (a zombie counts as gone).
fn alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    if raw <= 0 || kill(Pid::from_raw(raw), None).is_err() {
        return false;
    }
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .map(|(_, r)| r.trim_start().chars().next()),
            Some(Some('Z' | 'X'))
        ),
        Err(_) => true,
    }
}

// ----- acquire (the parent) -----

pub(crate) fn acquire(args: AcquireArgs) -> u8 {
    let dir = runtime_dir();
    if let Err(e) = prepare_runtime_dir(&dir) {
        eprintln!(
            "leasehold: runtime folder {}: {e} (set {RUNTIME_DIR_VAR})",
            dir.display()
        );
        return code::CONFIG;
    }
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("leasehold: cannot find my own executable: {e}");
            return code::CANNOT_RUN;
        }
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("__hold").arg("--key").arg(&args.target.key);
    if let Some(c) = &args.target.config {
        // The holder runs in the same folder, but make the path absolute anyway.
        cmd.arg("--config")
            .arg(std::path::absolute(c).unwrap_or_else(|_| c.clone()));
    }
    if let Some(t) = args.how.ttl {
        cmd.arg("--ttl")
            .arg(humantime::format_duration(t).to_string());
    }
    if let Some(w) = args.how.wait {
        cmd.arg("--wait")
            .arg(humantime::format_duration(w).to_string());
    }
    if args.how.no_wait {
        cmd.arg("--no-wait");
    }
    match &args.target.url {
        Some(url) => cmd.env(HOLDER_URL_VAR, url),
        None => cmd.env_remove(HOLDER_URL_VAR),
    };
    cmd.env(RUNTIME_DIR_VAR, &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C meant for the script does not reach it.
        .process_group(0);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("leasehold: cannot start the holder process: {e}");
            return code::CANNOT_RUN;
        }
    };
    let (Some(stdout), Some(mut confirm)) = (child.stdout.take(), child.stdin.take()) else {
        return code::CANNOT_RUN;
    };
    let key = args.target.key.clone();
    let quiet = args.how.quiet;
    // Blocking reads: nothing else needs this thread meanwhile.
    {
        let mut lines = BufReader::new(stdout).lines();
        loop {
            let line = match lines.next() {
                Some(Ok(l)) => l,
                Some(Err(_)) | None => {
                    let status = child.wait();
                    eprintln!("leasehold: the holder process ended without a word ({status:?})");
                    return code::CANNOT_RUN;
                }
            };
            let mut f = line.splitn(5, '\t');
            match f.next() {
                Some("waiting") if !quiet => {
                    let wait = f
                        .next()
                        .and_then(|w| humantime::parse_duration(w).ok())
                        .unwrap_or_default();
                    eprintln!("{}", wait_notice(&key, wait));
                }
                Some("held") => {
                    let backend = f.next().unwrap_or_default();
                    let token = f.next().unwrap_or("-");
                    let pid = f.next().unwrap_or_default();
                    let handle = f.next().unwrap_or_default();
                    let export = |k: &str, v: &str| format!("export {k}={}\n", shell_quote(v));
                    let mut out = export("LEASEHOLD_KEY", &key);
                    out += &export("LEASEHOLD_BACKEND", backend);
                    if token == "-" {
                        out += "unset LEASEHOLD_FENCING_TOKEN\n";
                    } else {
                        out += &export("LEASEHOLD_FENCING_TOKEN", token);
                    }
                    out += &export("LEASEHOLD_HOLDER_PID", pid);
                    out += &export(HANDLE_VAR, handle);
                    let mut stdout = io::stdout();
                    if let Err(e) = stdout
                        .write_all(out.as_bytes())
                        .and_then(|()| stdout.flush())
                    {
                        // Nobody will learn the handle: do not leave the lock held.
                        eprintln!("leasehold: cannot print the lease ({e}): releasing it");
                        let _ = ask(
                            &socket_of(Path::new(handle)),
                            "release",
                            Duration::from_secs(30),
                        );
                        return code::CANNOT_RUN;
                    }
                    // The handshake: printed, so the holder may keep the lock. Had we died
                    // before this line, it would see its stdin closed without `ok` and release.
                    if let Err(e) = confirm.write_all(b"ok\n").and_then(|()| confirm.flush()) {
                        eprintln!("leasehold: the holder process is gone ({e})");
                        return code::CANNOT_RUN;
                    }
                    return 0;
                }
                Some("error") => {
                    let c = f
                        .next()
                        .and_then(|c| c.parse().ok())
                        .unwrap_or(code::CANNOT_RUN);
                    eprintln!("leasehold: {}", f.collect::<Vec<_>>().join("\t"));
                    let _ = child.wait();
                    return c;
                }
                _ => {}
            }
        }
    }
}

// ----- the holder -----

/// One line to `acquire`; `false` if it is gone.
fn report(line: &str) -> bool {
    let mut out = io::stdout();
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}

fn clean_message(s: &str) -> String {
    s.replace(['\n', '\t'], " ")
}

/// How long the holder waits for `acquire`'s `ok` after reporting `held`.
const HANDSHAKE: Duration = Duration::from_secs(10);

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

/// Removes the records of holds of `key` at `location` that were lost, or whose holder died,
/// more than [`STALE_AFTER`] ago (nobody called `release` for them).
fn sweep_stale(dir: &Path, key: &str, location: &str, except: &Path) {
    let now = SystemTime::now();
    for (path, old) in states(dir) {
        let old_enough = fs::symlink_metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age > STALE_AFTER);
        if path != except
            && old.key == key
            && old.location == location
            && old_enough
            && (old.state == "lost" || !alive(old.pid))
        {
            let _ = fs::remove_file(socket_of(&path));
            let _ = fs::remove_file(&path);
        }
    }
}

/// Records of lost or dead holds nobody released are removed by a later `acquire` of the same
/// lock after this long.
const STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

pub(crate) async fn holder(mut args: AcquireArgs) -> u8 {
    if let Some(url) = std::env::var_os(HOLDER_URL_VAR).and_then(|u| u.into_string().ok()) {
        args.target.url = Some(url);
    }
    // Handlers replace the default actions: SIGHUP is ignored, SIGTERM and SIGINT release.
    let signals = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    );
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = signals else {
        report(&format!(
            "error\t{}\tcannot install signal handlers",
            code::CANNOT_RUN
        ));
        return code::CANNOT_RUN;
    };
    let dir = runtime_dir();
    if let Err(e) = prepare_runtime_dir(&dir) {
        report(&format!(
            "error\t{}\truntime folder {}: {}",
            code::CONFIG,
            dir.display(),
            clean_message(&e.to_string())
        ));
        return code::CONFIG;
    }

    let mut ack = watch_stdin();
    let obtained = obtain(&args.target, &args.how, |wait| {
        report(&format!("waiting\t{}", humantime::format_duration(wait)))
    });
    // Told to stop while still acquiring, or `acquire` is gone: give up (the acquisition cut
    // short is cleaned up before the process ends, see main).
    let gone = async {
        if confirmed(&mut ack).await {
            // `ok` before `held` is not the protocol; keep waiting for the lease regardless.
            std::future::pending::<()>().await;
        }
    };
    let obtained = tokio::select! {
        o = obtained => o,
        _ = term.recv() => Err(Failed { code: code::TERMINATED, message: "stopped by SIGTERM".to_owned() }),
        _ = int.recv() => Err(Failed { code: code::INTERRUPTED, message: "stopped by SIGINT".to_owned() }),
        () = gone => Err(Failed { code: code::CANNOT_RUN, message: "acquire is gone".to_owned() }),
    };
    let (_locker, lease) = match obtained {
        Ok(v) => v,
        Err(f) => {
            report(&format!("error\t{}\t{}", f.code, clean_message(&f.message)));
            return f.code;
        }
    };

    let pid = std::process::id();
    let mut state_path = dir.join(format!("{pid}.state"));
    if state_path.exists() {
        // A record kept from an earlier holder with the same (reused) pid: do not take it over.
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
            report(&format!(
                "error\t{}\tcannot listen on {}: {}",
                code::CANNOT_RUN,
                sock_path.display(),
                clean_message(&e.to_string())
            ));
            return code::CANNOT_RUN;
        }
    };
    let location = location_of(&args.target);
    let mut state = State {
        state: "held".to_owned(),
        key: args.target.key.clone(),
        backend: lease.backend_name().to_owned(),
        location: location.clone(),
        owner: lease.owner().as_str().to_owned(),
        token: lease.fencing_token().map(|t| t.get().to_string()),
        pid,
        acquired_at: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        lost_reason: None,
    };
    let cleanup = |with_state: bool| {
        let _ = fs::remove_file(&sock_path);
        if with_state {
            let _ = fs::remove_file(&state_path);
        }
    };
    if let Err(e) = state.write(&state_path) {
        let _ = lease.release().await;
        cleanup(true);
        report(&format!(
            "error\t{}\tcannot write {}: {}",
            code::CANNOT_RUN,
            state_path.display(),
            clean_message(&e.to_string())
        ));
        return code::CANNOT_RUN;
    }
    // Records of other holds of this lock stay until their own `release` reads them (a lost
    // hold's owner must learn of the loss); only those left for more than a day go.
    sweep_stale(&dir, &state.key, &location, &state_path);
    let token = state.token.clone().unwrap_or_else(|| "-".to_owned());
    if !report(&format!(
        "held\t{}\t{token}\t{pid}\t{}",
        state.backend,
        state_path.display()
    )) {
        // Nobody learnt we hold it: give it back.
        let _ = lease.release().await;
        cleanup(true);
        return 1;
    }

    let lost = lease.lost().wait();
    tokio::pin!(lost);
    let handshake_until = tokio::time::Instant::now() + HANDSHAKE;
    let mut is_confirmed = false;
    loop {
        tokio::select! {
            reason = &mut lost => {
                // The record first, then the socket: a `release` that finds no socket reads
                // the state file and reports the loss.
                state.state = "lost".to_owned();
                state.lost_reason = Some(clean_message(&reason.to_string()));
                if state.write(&state_path).is_err() {
                    cleanup(true);
                } else {
                    cleanup(false);
                }
                // Whatever is left (a Redlock minority, say); bounded.
                let _ = tokio::time::timeout(Duration::from_secs(5), lease.release()).await;
                return code::LOST;
            }
            ok = tokio::time::timeout_at(handshake_until, confirmed(&mut ack)), if !is_confirmed => {
                if matches!(ok, Ok(true)) {
                    is_confirmed = true;
                } else {
                    // `acquire` died before printing the handle: nobody can release this.
                    let _ = release_and_exit(&lease, &cleanup).await;
                    return code::CANNOT_RUN;
                }
            }
            _ = term.recv() => return release_and_exit(&lease, &cleanup).await.1,
            _ = int.recv() => return release_and_exit(&lease, &cleanup).await.1,
            _ = hup.recv() => {}
            conn = listener.accept() => {
                let Ok((stream, _)) = conn else { continue };
                let (read, mut write) = stream.into_split();
                let mut line = String::new();
                let mut reader = tokio::io::BufReader::new(read);
                let got = tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line)).await;
                if !matches!(got, Ok(Ok(_))) {
                    continue;
                }
                match line.trim() {
                    "release" => {
                        let (answer, code) = release_and_exit(&lease, &cleanup).await;
                        let _ = write.write_all(format!("{answer}\n").as_bytes()).await;
                        let _ = write.shutdown().await;
                        return code;
                    }
                    _ => {
                        let _ = write.write_all(b"error\tunknown request\n").await;
                    }
                }
            }
        }
    }
}

/// Releases the lease and removes the files; the answer for `release` and the exit code.
async fn release_and_exit(lease: &Lease, cleanup: &impl Fn(bool)) -> (String, u8) {
    let outcome = lease.release().await;
    cleanup(true);
    match outcome {
        Ok(true) => ("released".to_owned(), 0),
        Ok(false) => ("not-held".to_owned(), code::LOST),
        Err(e) => (
            format!("error\t{}", clean_message(&e.to_string())),
            code::UNAVAILABLE,
        ),
    }
}

// ----- release -----

pub(crate) async fn release(args: ReleaseArgs) -> u8 {
    let dir = runtime_dir();
    let handle = match (&args.handle, &args.key) {
        (Some(h), _) => h.clone(),
        (None, Some(key)) => {
            let location = (args.url.is_some() || args.config.is_some()).then(|| {
                location_of(&Target {
                    key: key.clone(),
                    url: args.url.clone(),
                    config: args.config.clone(),
                })
            });
            let found: Vec<(PathBuf, State)> = states(&dir)
                .into_iter()
                .filter(|(_, s)| &s.key == key)
                .filter(|(_, s)| location.as_ref().is_none_or(|l| &s.location == l))
                .collect();
            // A hold that was lost, or whose holder died, is reported (and its record
            // consumed) before any live holder is touched: its owner is the likelier caller,
            // and releasing someone else's live lock mid-work is the worse mistake.
            let (ended, live): (Vec<_>, Vec<_>) = found
                .into_iter()
                .partition(|(_, s)| s.state == "lost" || !alive(s.pid));
            if let Some((path, state)) = ended.into_iter().min_by_key(|(_, s)| s.acquired_at) {
                return report_ended(&path, &state);
            }
            match live.as_slice() {
                [] => {
                    eprintln!(
                        "leasehold: no holder of {key:?} in {} (was it acquired with another {RUNTIME_DIR_VAR}?)",
                        dir.display()
                    );
                    return code::FREE;
                }
                [(one, _)] => one.clone(),
                many => {
                    eprintln!(
                        "leasehold: several live holders of {key:?}; say which with --handle (or --url/--config):"
                    );
                    for (p, _) in many {
                        eprintln!("  {}", p.display());
                    }
                    return code::USAGE;
                }
            }
        }
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
    if state.state == "lost" {
        return report_ended(&handle, &state);
    }
    let sock = socket_of(&handle);
    let timeout = args.timeout;
    let answer = tokio::task::spawn_blocking(move || ask(&sock, "release", timeout)).await;
    let answer = match answer {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            // The holder may have been busy losing the lease: the state file says.
            let state = match read_handle(&handle) {
                Ok(s) => s,
                Err(c) => return c,
            };
            if state.state != "lost" && alive(state.pid) {
                eprintln!(
                    "leasehold: the holder (pid {}) of {:?} does not answer: {e}",
                    state.pid, state.key
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
    while alive(state.pid) && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    match answer
        .split_once('\t')
        .map_or((answer.as_str(), ""), |(a, b)| (a, b))
    {
        ("released", _) => 0,
        ("not-held", _) => {
            eprintln!(
                "leasehold: the lease on {:?} was no longer held when released",
                state.key
            );
            code::LOST
        }
        (_, msg) => {
            eprintln!("leasehold: release of {:?} failed: {msg}", state.key);
            code::UNAVAILABLE
        }
    }
}

/// Reads a handle; an exit code when it cannot (1 when there is none: already released).
fn read_handle(handle: &Path) -> Result<State, u8> {
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
    if state.state == "lost" {
        eprintln!(
            "leasehold: the lease on {:?} was lost: {}",
            state.key,
            state.lost_reason.as_deref().unwrap_or("no reason recorded")
        );
    } else {
        eprintln!(
            "leasehold: the holder (pid {}) of {:?} is gone without releasing; the lock ends by its TTL or session",
            state.pid, state.key
        );
    }
    let _ = fs::remove_file(socket_of(handle));
    let _ = fs::remove_file(handle);
    code::LOST
}

/// Sends one request to a holder's socket and reads its one-line answer.
fn ask(sock: &Path, request: &str, timeout: Duration) -> io::Result<String> {
    let mut stream = UnixStream::connect(sock)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(format!("{request}\n").as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let answer = answer.trim().to_owned();
    if answer.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the holder closed the connection without an answer",
        ));
    }
    Ok(answer)
}
