//! The records of `acquire`'s holders: the runtime folder, each holder's state file (its
//! handle) and socket, and how `release` talks to a holder.
//!
//! A holder's state file `<runtime dir>/<pid>.state` holds `KEY='value'` lines (see [`State`]);
//! its socket `<runtime dir>/<pid>.sock` answers a `release` line with `released`, `not-held`
//! or `error\t<message>`. Records of lost holds and dead holders stay until their `release`
//! consumes them (a later `acquire` of the same lock sweeps those older than a day);
//! a holder never removes another's record.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::Lease;

use nix::fcntl::OFlag;
use nix::sys::signal::kill;
use nix::unistd::Pid;

/// The folder of state files and sockets, if set.
pub const RUNTIME_DIR_VAR: &str = "LEASEHOLD_RUNTIME_DIR";
/// The handle `release` uses when given no `--key` nor `--handle`.
pub const HANDLE_VAR: &str = "LEASEHOLD_HANDLE";
/// The runtime folder: `$LEASEHOLD_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/leasehold`, else
/// `leasehold-<uid>` in the temporary folder.
pub fn runtime_dir() -> PathBuf {
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

/// Creates the runtime folder (mode 0700) and checks it ([`verify_runtime_dir`]).
pub fn prepare_runtime_dir(dir: &Path) -> io::Result<()> {
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    verify_runtime_dir(dir)
}

/// Checks that a runtime folder is a folder (not a symbolic link), ours and private; refuses it
/// otherwise (a folder others can write to is not fixed silently).
pub fn verify_runtime_dir(dir: &Path) -> io::Result<()> {
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

/// Checks that `handle` may name a holder's state file before anything reads or deletes it:
/// named as a holder names its state file, directly inside a folder that passes [`verify_runtime_dir`]. The file itself
/// is checked when read ([`State::read`]).
pub fn verify_handle(handle: &Path) -> io::Result<()> {
    if !is_named_like_a_handle(handle) {
        return Err(io::Error::other(format!(
            "{} is not a handle printed by `leasehold acquire` (<pid>.state in a runtime folder)",
            handle.display()
        )));
    }
    let dir = handle
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    verify_runtime_dir(dir)
}

/// Whether the file name is one a holder gives its state file: `<pid>.state`, or
/// `<pid>-<nanoseconds>.state` when a record of an earlier holder with the same pid is there.
fn is_named_like_a_handle(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".state"))
        .is_some_and(|id| {
            id.starts_with(|c: char| c.is_ascii_digit())
                && id.bytes().all(|b| b.is_ascii_digit() || b == b'-')
        })
}

/// Removes a hold's record: its state file, and its socket if that is one (checked, so that a
/// file planted under the socket's name is left alone).
pub fn remove_record(state: &Path) {
    let sock = socket_of(state);
    if fs::symlink_metadata(&sock).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = fs::remove_file(&sock);
    }
    let _ = fs::remove_file(state);
}

/// The most a state file may hold: far more than any record `render` writes.
const MAX_STATE_BYTES: u64 = 64 * 1024;

/// What a state file says, one `LEASEHOLD_<NAME>='value'` line per field. The fields stay in
/// this module: other modules ask the questions below.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct State {
    /// `held` while the holder keeps the lease, `lost` once it saw the lease go.
    state: String,
    key: String,
    backend: String,
    /// Where the lock lives, without secrets (see `lock::location_of`).
    location: String,
    owner: String,
    token: Option<String>,
    pid: u32,
    /// Unix seconds.
    acquired_at: u64,
    lost_reason: Option<String>,
}

impl State {
    /// The record of a hold of `key` at `location` by process `pid`, acquired now.
    pub fn held(key: &str, location: &str, lease: &Lease, pid: u32) -> Self {
        Self {
            state: "held".to_owned(),
            key: key.to_owned(),
            backend: lease.backend_name().to_owned(),
            location: location.to_owned(),
            owner: lease.owner().as_str().to_owned(),
            token: lease.fencing_token().map(|t| t.get().to_string()),
            pid,
            acquired_at: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            lost_reason: None,
        }
    }

    /// Marks the hold lost, for `reason`.
    pub fn lose(&mut self, reason: String) {
        self.state = "lost".to_owned();
        self.lost_reason = Some(reason);
    }

    /// Whether the holder saw its lease go.
    pub fn is_lost(&self) -> bool {
        self.state == "lost"
    }

    /// Whether the hold ended without `release`: lost, or its holder is dead.
    pub fn has_ended(&self) -> bool {
        self.is_lost() || !alive(self.pid)
    }

    /// Whether this is a hold of `key`, at `location` when one is given.
    pub fn is_of(&self, key: &str, location: Option<&str>) -> bool {
        self.key == key && location.is_none_or(|l| self.location == l)
    }

    /// The lock's name.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The holder process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Of several ended holds, the one acquired first.
    pub fn oldest(holds: Vec<(PathBuf, State)>) -> Option<(PathBuf, State)> {
        holds.into_iter().min_by_key(|(_, s)| s.acquired_at)
    }

    /// What `release` says of a hold that ended without it.
    pub fn end_notice(&self) -> String {
        if self.is_lost() {
            format!(
                "the lease on {:?} was lost: {}",
                self.key,
                self.lost_reason.as_deref().unwrap_or("no reason recorded")
            )
        } else {
            format!(
                "the holder (pid {}) of {:?} is gone without releasing; the lock ends by its TTL or session",
                self.pid, self.key
            )
        }
    }

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

    /// Reads a state file: a regular file of ours (a symbolic link is not followed), at most
    /// [`MAX_STATE_BYTES`] long.
    pub fn read(path: &Path) -> io::Result<Self> {
        let file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(OFlag::O_NOFOLLOW.bits())
            .open(path)?;
        let meta = file.metadata()?;
        if !meta.file_type().is_file() || meta.uid() != nix::unistd::getuid().as_raw() {
            return Err(io::Error::other(format!(
                "{} is not a regular file of ours",
                path.display()
            )));
        }
        let mut text = String::new();
        file.take(MAX_STATE_BYTES).read_to_string(&mut text)?;
        Ok(Self::parse(&text))
    }

    /// Writes the file atomically (a temporary file renamed over it).
    pub fn write(&self, path: &Path) -> io::Result<()> {
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

/// The socket of the holder whose state file is `state`.
pub fn socket_of(state: &Path) -> PathBuf {
    state.with_extension("sock")
}

/// Every state file in the runtime folder (`<pid>.state`, regular, ours), with what it says.
pub fn states(dir: &Path) -> Vec<(PathBuf, State)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(PathBuf, State)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| is_named_like_a_handle(p))
        .filter_map(|p| State::read(&p).ok().map(|s| (p, s)))
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// Whether process `pid` is alive (a zombie counts as gone).
pub fn alive(pid: u32) -> bool {
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

/// Removes the records of holds of `key` at `location` that were lost, or whose holder died,
/// more than a day ago (nobody called `release` for them).
pub fn sweep_stale(dir: &Path, key: &str, location: &str, except: &Path) {
    let now = SystemTime::now();
    for (path, old) in states(dir) {
        let old_enough = fs::symlink_metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| now.duration_since(t).ok())
            .is_some_and(|age| age > STALE_AFTER);
        if path != except && old.is_of(key, Some(location)) && old_enough && old.has_ended() {
            remove_record(&path);
        }
    }
}

/// Records of lost or dead holds nobody released are removed by a later `acquire` of the same
/// lock after this long.
const STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

/// Sends one request to a holder's socket and reads its one-line answer.
pub fn ask(sock: &Path, request: &str, timeout: Duration) -> io::Result<String> {
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

/// The one request a holder's socket takes.
pub const RELEASE: &str = "release";

/// The longest request line a holder reads from its socket.
pub const MAX_REQUEST_BYTES: u64 = 256;

/// A holder's answer to [`RELEASE`], one line on its socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// `released`: the lease was held and is released.
    Released,
    /// `not-held`: the lease was gone when released.
    NotHeld,
    /// `error\t<message>`: the release failed (or the answer was not understood).
    Failed(String),
}

impl Answer {
    /// The line the holder writes (without its newline).
    pub fn line(&self) -> String {
        match self {
            Self::Released => "released".to_owned(),
            Self::NotHeld => "not-held".to_owned(),
            Self::Failed(msg) => format!("error\t{}", msg.replace(['\n', '\r', '\t'], " ")),
        }
    }

    /// Reads an answer line (surrounding white space ignored).
    pub fn parse(line: &str) -> Self {
        match line.trim().split_once('\t') {
            None if line.trim() == "released" => Self::Released,
            None if line.trim() == "not-held" => Self::NotHeld,
            Some(("error", msg)) => Self::Failed(msg.to_owned()),
            _ => Self::Failed(format!("unexpected answer {:?}", line.trim())),
        }
    }
}

/// Quotes a value for POSIX shells: `'…'`, with `'` written as `'\''`.
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The inverse of [`shell_quote`] for the values it writes.
pub fn shell_unquote(s: &str) -> String {
    let s = s.trim();
    match s.strip_prefix('\'').and_then(|s| s.strip_suffix('\'')) {
        Some(inner) => inner.replace(r"'\''", "'"),
        None => s.to_owned(),
    }
}

#[doc(hidden)]
pub mod fuzzing {
    //! Entry points for the fuzz targets in `fuzz/`.

    use super::State;

    /// A record with these fields: state, key, backend, location, owner, and the optional
    /// token and lost reason.
    pub fn record(
        text: [&str; 5],
        token: Option<&str>,
        pid: u32,
        acquired_at: u64,
        lost_reason: Option<&str>,
    ) -> State {
        let [state, key, backend, location, owner] = text.map(str::to_owned);
        State {
            state,
            key,
            backend,
            location,
            owner,
            token: token.map(str::to_owned),
            pid,
            acquired_at,
            lost_reason: lost_reason.map(str::to_owned),
        }
    }

    /// What the state file of `state` holds.
    pub fn render(state: &State) -> String {
        state.render()
    }

    /// A state file's text, read.
    pub fn parse(text: &str) -> State {
        State::parse(text)
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
    fn socket_answers_read_back_as_one_line() {
        for answer in [Answer::Released, Answer::NotHeld] {
            assert_eq!(Answer::parse(&answer.line()), answer);
        }
        // A message with line breaks or tabs stays one answer, and stays an error.
        let failed = Answer::Failed("timed out\nreleased\tx".to_owned());
        assert!(!failed.line().contains('\n'));
        assert_eq!(
            Answer::parse(&failed.line()),
            Answer::Failed("timed out released x".to_owned())
        );
        assert!(matches!(Answer::parse("released\tx"), Answer::Failed(_)));
        assert!(matches!(Answer::parse(""), Answer::Failed(_)));
    }
}
