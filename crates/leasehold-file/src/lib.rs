//! The `file://` backend of **leasehold**: operating-system file locks on one host (Unix only),
//! with a durable fencing counter kept beside each lock file.
//!
//! It is what `leasehold run --key nightly -- ./job.sh` will use when no URL is given: it needs
//! no server, and it excludes across processes of one host (and across tasks of one process).
//!
//! # How it works
//!
//! - Each key has a lock file `<dir>/<name>.lock`, locked with an exclusive `flock(2)`-style lock
//!   (Rust's `File::try_lock`). The kernel drops the lock when the holder's file is closed, so a
//!   holder that crashes or is killed releases at once.
//! - After locking, the backend checks that the file it locked is still the one at the path (a
//!   lock file deleted or replaced by hand would otherwise let a second holder in); it writes its
//!   owner value into the lock file, for [`inspect`](leasehold_core::LockBackend::inspect).
//! - The fencing token is a counter in `<dir>/<name>.fence`, read, incremented and written back
//!   with `fsync` while the lock is held: it strictly increases across holders, survives
//!   restarts and crashes, and is never reset by the backend.
//! - While a lease is held, a check runs every `check_interval` (default 1 s): if the lock file
//!   was deleted or replaced, the lease's lost signal fires.
//! - The backend never deletes a file by itself; [`FileBackend::prune`] deletes lock files
//!   nobody holds, when asked (see [below](#what-keys-leave-behind)).
//!
//! # Key mapping
//!
//! `<name>` is the key with every byte outside `[A-Za-z0-9._-]` written as `%XX`; keys whose
//! name would pass 200 bytes use their first 100 bytes followed by `~` and 32 hex digits of
//! the key's SHA-256. `flock(1)` takes the same lock:
//!
//! ```text
//! flock -n /var/tmp/leasehold-$(id -u)/nightly.lock -c ./job.sh    # excludes `leasehold run --key nightly`
//! ```
//!
//! (with the default folder; `flock(1)` follows symbolic links and creates the file with your
//! umask: run it as the same user, in a folder of your own.)
//!
//! # The lock folder
//!
//! The default folder is `$LEASEHOLD_DIR` if set, else **`/var/tmp/leasehold-<uid>`**
//! ([`FileConfig::per_user_dir`]), `<uid>` being the effective user id:
//!
//! - **One folder per user.** On a host shared with other users, a common folder such as
//!   `/tmp/leasehold` lets whoever creates it first hold every lock forever, rewrite fence
//!   counters (tokens would go backwards), or plant links; a folder per user gives each user
//!   locks no one else can touch.
//! - **Persistent.** `/var/tmp` survives logout and reboot, so fence counters keep increasing.
//!   `$XDG_RUNTIME_DIR` would not do: it is wiped at logout (counters would restart at 1) and is
//!   unset under cron. Some distributions age files in `/var/tmp` (`systemd-tmpfiles`, 30 days
//!   on Fedora and Ubuntu): a key unused for that long restarts its counter at 1. When a
//!   resource checks fencing tokens, configure a folder nobody ages (`/var/lib/<app>/locks`).
//! - **The same in every context.** It depends on the user id alone, not on `$HOME`, `$TMPDIR`
//!   or `$XDG_*`: a shell, cron, a systemd unit and `sudo -u` of one user all lock in the same
//!   folder. `$LEASEHOLD_DIR` is read from the environment: set it where every context sees it
//!   (the crontab's variables, the unit's `Environment=`), or use a `file:///dir` URL.
//!
//! Whatever the folder, [`FileBackend::new`] refuses one that others could tamper with
//! ([`ErrorKind::InvalidConfig`], saying why): a symbolic link, a folder that is not ours, one
//! writable by the group or other users, or one whose parent others can write without the
//! sticky bit. A missing folder is created with mode 0700. Lock and fence files are opened
//! without following symbolic links (`O_NOFOLLOW`), created with mode 0600, and checked with
//! `fstat` before anything is written to them: a regular file with one link, owned by us.
//! So a link, device, FIFO or hard link planted under a lock file's name is refused, and no
//! file outside the folder is ever written or truncated. `inspect` reads at most 256 bytes
//! of a lock or fence file.
//!
//! ## A folder shared by several users
//!
//! `file:///srv/locks?shared=true` ([`FileConfig::with_shared`]) lets several users take the
//! same locks. The folder must exist (for a group: `install -d -m 2770 -g locks /srv/locks`);
//! it may belong to another user and be writable by its group, but must not be a symbolic link
//! nor writable by every user without the sticky bit. New files are made mode 0660; lock files
//! of other users are used. What still holds: no symbolic link is followed, only regular files
//! with one link are written, so a member cannot make another write or truncate a file outside
//! the folder. What does not: **every user who can write the folder is trusted** — any of them
//! can hold a lock forever, delete a lock file (two holders can follow) or rewrite a fence
//! counter (tokens go backwards). Share a folder only with users you would let hold your locks.
//!
//! # What keys leave behind
//!
//! Every key ever locked leaves its two small files: keys must come from a **bounded set**
//! (job names, not request ids), or the folder grows without end (`leasehold-bench perf`
//! measures the files and bytes of one key). [`FileBackend::prune`] (or
//! [`prune_key`](FileBackend::prune_key)) deletes the `.lock` files nobody holds: it locks each
//! (`LOCK_EX|LOCK_NB`, skipping held ones), checks that the path still names the file it locked,
//! and unlinks it while holding the lock; an acquirer that opened the old file makes the same
//! check after locking and opens the path again, so no two holders follow. Free semaphore slot
//! files (`<name>~sem<i>.lock`, see [`FilePermits`]) go the same way. `.fence` files (a
//! semaphore's `~sem.fence` too) and a semaphore's `~sem.limit` file are **kept**: deleting a
//! fence file restarts the key's tokens at 1. Do not prune a folder in which
//! `flock(1)` or another tool that skips that check takes locks.
//!
//! # Many leases in one process
//!
//! Every lock and permit held keeps its lock file open: one descriptor each, so the process's
//! open-file limit (`ulimit -n`, the soft limit, less the files the process has open for other
//! work) bounds how many it can hold at once. Past it an acquisition fails with
//! [`ErrorKind::Unavailable`] and a message naming that limit; the leases already held are not
//! affected, and each one released frees a descriptor for the next. Raise the limit for a
//! process that holds thousands (`LimitNOFILE=` in a systemd unit). While held, each lease is
//! checked every `check_interval` (a `stat` of its path and of its open file).
//!
//! # What it does not guarantee
//!
//! - Mutual exclusion holds on **one host** only ([`SafetyClass::Host`]); on a network file
//!   system (NFS, SMB) `flock` may be local to each client and exclude nobody.
//! - The TTL does not end a grant: it lasts until it is released, its process exits, or its lock
//!   file is deleted ([`RenewalKind::Session`]).
//!
//! # Cancellation and drop
//!
//! The blocking file operations run on Tokio's blocking pool. An acquire whose future is dropped
//! mid-flight closes the file it may have locked as soon as the blocking call returns, which
//! releases the lock; a dropped [`Lease`](leasehold_core::Lease) closes its file in the
//! background.
//!
//! # Configuration
//!
//! `file:///absolute/path/to/dir`, or `file://` alone for [`FileConfig::default_dir`], with
//! `?shared=true` for a shared folder; see [`FileConfig::from_url`]. The folder namespaces the keys: there is no key prefix
//! ([`DEFAULT_PREFIX`] is empty, and a configured prefix is ignored).
//!
//! [`SafetyClass::Host`]: leasehold_core::SafetyClass::Host
//! [`RenewalKind::Session`]: leasehold_core::RenewalKind::Session

#![cfg(unix)]

mod election;
mod folder;
mod permits;
mod prune;

pub use permits::FilePermits;

use std::fs::{File, TryLockError};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_core::async_trait;
use leasehold_core::driver::{Driver, Opening, Target, connecting};
use leasehold_core::{
    Candidate, Capabilities, DEFAULT_MAX_TTL, ElectionBackend, Error, ErrorKind, ExtendRequest,
    FencingKind, FencingToken, Grant, Held, HolderInfo, LeaseMonitor, LockBackend, LockKey,
    LockRequest, Owner, PermitBackend, PermitLimit, RenewalKind, SafetyClass, Validity, WaitKind,
    Waited, redact,
};
use nix::errno::Errno;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use folder::{Sharing, identity_at, next_token, take, write_owner};
pub use prune::Pruned;

/// The backend's name.
pub const NAME: &str = "file";

/// URL schemes of [`FileBackend`]: `file:///path/to/dir`.
pub const SCHEMES: &[&str] = &["file"];

/// The key prefix: none, since the folder namespaces the keys.
pub const DEFAULT_PREFIX: &str = "";

/// The driver's entry for a registry (the `leasehold` facade's): opens [`SCHEMES`]. A
/// configured key prefix is ignored (see [`DEFAULT_PREFIX`]).
pub static DRIVER: Driver = Driver::new(NAME, SCHEMES, open);

fn open(target: &Target<'_>) -> Result<Opening, Error> {
    let config = FileConfig::from_url(target.url)?;
    // Creating the folder is the only I/O: done when the opening is awaited.
    Ok(connecting(async move { FileBackend::new(config) }))
}

/// Where the lock files live, whether several users share the folder, and how often a held
/// lock is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileConfig {
    dir: PathBuf,
    check_interval: Duration,
    sharing: Sharing,
}

impl Default for FileConfig {
    fn default() -> Self {
        Self::new(Self::default_dir())
    }
}

impl FileConfig {
    /// Lock files in `dir` (created if missing), checked every second while held.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            check_interval: Duration::from_secs(1),
            sharing: Sharing::Private,
        }
    }

    /// The default folder: `$LEASEHOLD_DIR` if set, else [`per_user_dir`](Self::per_user_dir)
    /// (see "The lock folder" in the [crate docs](crate)).
    pub fn default_dir() -> PathBuf {
        std::env::var_os("LEASEHOLD_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(Self::per_user_dir)
    }

    /// The folder of this user when nothing else is configured: `/var/tmp/leasehold-<uid>`,
    /// `<uid>` being the effective user id. It depends on nothing but the user id, so a shell,
    /// cron, a systemd unit and `sudo -u` of one user all find the same folder.
    pub fn per_user_dir() -> PathBuf {
        folder::per_user_dir()
    }

    /// From `file:///absolute/path` (or `file://` alone for the default folder), with the
    /// options `?shared=true` for a folder shared by several users
    /// ([`with_shared`](Self::with_shared)) and `check_interval_ms=N`
    /// ([`with_check_interval`](Self::with_check_interval)).
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let rest = url
            .strip_prefix("file://")
            .ok_or_else(|| invalid(format!("{}: a file URL starts with file://", redact(url))))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut config = if path.is_empty() {
            Self::default()
        } else if path.starts_with('/') {
            Self::new(path)
        } else {
            return Err(invalid(format!(
                "{}: the folder must be an absolute path (file:///path/to/dir)",
                redact(url)
            )));
        };
        for option in query.split('&').filter(|o| !o.is_empty()) {
            let millis = option
                .strip_prefix("check_interval_ms=")
                .map(|v| v.parse::<u64>().map(Duration::from_millis));
            config = match (option, millis) {
                ("shared=true" | "shared=1", _) => config.with_shared(true),
                ("shared=false" | "shared=0", _) => config.with_shared(false),
                (_, Some(Ok(interval))) => config.with_check_interval(interval),
                _ => {
                    return Err(invalid(format!(
                        "{}: unknown or malformed option {} (the options are shared=true and \
                         check_interval_ms=N)",
                        redact(url),
                        redact(option)
                    )));
                }
            };
        }
        Ok(config)
    }

    /// A folder shared by several users (`?shared=true` in a URL): it may belong to another
    /// user and be writable by its group, and lock files of other users in it are used. It
    /// must already exist and must not be a symbolic link nor writable by every user without
    /// the sticky bit; new files are made mode 0660. Every user who can write the folder is
    /// trusted: see "A folder shared by several users" in the [crate docs](crate).
    pub fn with_shared(mut self, shared: bool) -> Self {
        self.sharing = if shared {
            Sharing::Shared
        } else {
            Sharing::Private
        };
        self
    }

    /// Whether the folder is shared by several users ([`with_shared`](Self::with_shared)).
    pub fn is_shared(&self) -> bool {
        self.sharing == Sharing::Shared
    }

    /// Sets how often a held lock is checked (at least 10 ms).
    pub fn with_check_interval(mut self, interval: Duration) -> Self {
        self.check_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// The folder of the lock files.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidConfig, NAME, msg)
}

/// `Unavailable` (a file that could not be opened may open at the next attempt: one more lock
/// released frees a descriptor), saying which limit a descriptor shortage hit.
fn io_error(what: &str, path: &Path, e: &io::Error) -> Error {
    let hint = match e.raw_os_error().map(Errno::from_raw) {
        Some(Errno::EMFILE) => {
            "; every lock and permit held keeps its file open: raise this process's open-file \
             limit (`ulimit -n`, systemd's `LimitNOFILE=`)"
        }
        Some(Errno::ENFILE) => "; the host's open-file table is full (`fs.file-max`)",
        _ => "",
    };
    Error::new(
        ErrorKind::Unavailable,
        NAME,
        format!("{what} {}: {e}{hint}", path.display()),
    )
}

/// Locks as operating-system file locks on one host. See the [crate docs](crate).
#[derive(Clone, Debug)]
pub struct FileBackend {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: FileConfig,
    held: AtomicUsize,
}

/// A file just locked: the file, its identity, the token, its path and its count.
type Taken = (File, (u64, u64), u64, PathBuf, Count);

/// The grant's state: the locked file (closing it releases the lock) and its identity.
struct Locked {
    file: Mutex<Option<File>>,
    path: PathBuf,
    identity: (u64, u64),
    _count: Count,
}

/// Counts live grants of a backend, and acquisitions that may still lock a file (for
/// [`FileBackend::held_count`]).
struct Count(Arc<Inner>);

impl Count {
    fn new(inner: &Arc<Inner>) -> Self {
        inner.held.fetch_add(1, Ordering::SeqCst);
        Self(Arc::clone(inner))
    }
}

impl Drop for Count {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Locked {
    /// Whether we still hold the file lock on the file at the path.
    fn still_ours(&self) -> bool {
        let open = self
            .file
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        open && identity_at(&self.path).ok() == Some(self.identity)
    }
}

impl FileBackend {
    /// A backend keeping its lock files in the configured folder: a private folder is created
    /// (mode 0700) if missing; a folder others could tamper with is refused
    /// ([`ErrorKind::InvalidConfig`], saying why).
    pub fn new(config: FileConfig) -> Result<Self, Error> {
        folder::prepare(&config.dir, config.sharing).map_err(invalid)?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                held: AtomicUsize::new(0),
            }),
        })
    }

    /// The lock file of `key` (see "Key mapping" in the crate docs).
    pub fn lock_path(&self, key: &LockKey) -> PathBuf {
        self.inner
            .config
            .dir
            .join(format!("{}.lock", file_name(key)))
    }

    fn fence_path(&self, key: &LockKey) -> PathBuf {
        self.inner
            .config
            .dir
            .join(format!("{}.fence", file_name(key)))
    }

    /// Deletes the lock files in the folder that nobody holds, keeping every fence file (see
    /// "What keys leave behind" in the [crate docs](crate)). Safe while leasehold processes
    /// lock in the folder; not while `flock(1)` or another tool that does not check the path
    /// after locking does.
    pub async fn prune(&self) -> Result<Pruned, Error> {
        let (dir, sharing) = (self.inner.config.dir.clone(), self.inner.config.sharing);
        blocking(move || {
            prune::prune_dir(&dir, sharing).map_err(|e| io_error("cannot prune", &dir, &e))
        })
        .await
    }

    /// [`prune`](Self::prune) for one key: `true` if its lock file was deleted, `false` if it
    /// is held (or was not there).
    pub async fn prune_key(&self, key: &LockKey) -> Result<bool, Error> {
        let (lock, sharing) = (self.lock_path(key), self.inner.config.sharing);
        blocking(move || {
            prune::prune_one(&lock, sharing).map_err(|e| io_error("cannot prune", &lock, &e))
        })
        .await
    }

    /// How many grants of this backend are held right now, counting acquisitions still taking
    /// their file lock (an abandoned one lets go as soon as its blocking call returns).
    pub fn held_count(&self) -> usize {
        self.inner.held.load(Ordering::SeqCst)
    }

    /// The grant of a locked file (a lock's or a permit slot's), under watch.
    fn grant(&self, req: &LockRequest<'_>, taken: Taken) -> Grant {
        let (file, identity, token, path, count) = taken;
        let locked = Arc::new(Locked {
            file: Mutex::new(Some(file)),
            path,
            identity,
            _count: count,
        });
        self.watch(&locked, req.monitor, req.ttl);
        Grant::new(req.ttl_validity())
            .with_fencing(FencingToken::new(token))
            .with_state(locked)
    }

    /// Watches a held grant until its lease is over: fires the lost signal if the lock file is
    /// deleted or replaced, and reports validity after each good check.
    fn watch(&self, locked: &Arc<Locked>, monitor: &LeaseMonitor, ttl: Duration) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (locked, monitor) = (Arc::downgrade(locked), monitor.clone());
        let interval = self.inner.config.check_interval;
        drop(rt.spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let started = Instant::now();
                let Some(l) = locked.upgrade() else { return };
                if monitor.is_closed() {
                    return;
                }
                if l.still_ours() {
                    if !monitor.renewed(Validity::new(started, ttl)) {
                        return;
                    }
                } else {
                    monitor.lost(format!(
                        "lock file {} was deleted or replaced",
                        l.path.display()
                    ));
                    return;
                }
            }
        }));
    }
}

/// Runs blocking file work on Tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::new(ErrorKind::Backend, NAME, format!("file task failed: {e}")))?
}

/// The bytes a file name keeps as they are: `[A-Za-z0-9._-]` (`~` is escaped: it separates
/// a long name's hash).
const NAME_KEEPS: &AsciiSet = &NON_ALPHANUMERIC.remove(b'.').remove(b'_').remove(b'-');

/// The file name of a key (without extension).
fn file_name(key: &LockKey) -> String {
    let mut name = utf8_percent_encode(key.as_str(), NAME_KEEPS).to_string();
    if name.starts_with('.') {
        // Never a hidden file, nor `.` or `..`.
        name.replace_range(0..1, "%2E");
    }
    if name.len() > 200 {
        let digest = Sha256::digest(key.as_str().as_bytes());
        let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
        let head: String = name.chars().take(100).collect();
        name = format!("{head}~{hex}");
    }
    name
}

#[doc(hidden)]
pub mod fuzzing {
    //! Internal entry points for the fuzz targets in `fuzz/`; not part of the API.

    /// The file name of `key`, without extension (see "Key mapping" in the crate docs).
    pub fn file_name(key: &leasehold_core::LockKey) -> String {
        super::file_name(key)
    }
}

#[async_trait]
impl LockBackend for FileBackend {
    /// A view over a backend of the `elections` subfolder (see the `election` module).
    fn election(self: Arc<Self>, candidate: Candidate) -> Result<Arc<dyn ElectionBackend>, Error> {
        let mut config = self.inner.config.clone();
        config.dir = config.dir.join(election::SUBFOLDER);
        let sharing = config.sharing;
        let locks = FileBackend::new(config)?;
        let paths = locks.clone();
        let side: election::SidePath =
            Arc::new(move |k: &LockKey| paths.lock_path(k).with_extension("leader"));
        Ok(Arc::new(leasehold_core::LockElection::new(
            Arc::new(locks),
            Arc::new(election::FileLeaders::new(side, sharing)),
            candidate,
            election::POLL,
        )))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(NAME, SafetyClass::Host, FencingKind::Monotonic)
            .with_elections()
            .with_wait(WaitKind::Poll)
            .with_renewal(RenewalKind::Session)
            .with_ttl_range(self.inner.config.check_interval * 2, DEFAULT_MAX_TTL)
            .with_semaphores()
            .with_crash_release(leasehold_core::CrashRelease::ProcessExit)
    }

    /// A [`FilePermits`] view over this backend's folder.
    fn semaphore(self: Arc<Self>, limit: PermitLimit) -> Result<Arc<dyn PermitBackend>, Error> {
        Ok(Arc::new(FilePermits::new((*self).clone(), limit)))
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        let (lock, fence, owner) = (
            self.lock_path(req.key),
            self.fence_path(req.key),
            req.owner.clone(),
        );
        let sharing = self.inner.config.sharing;
        // Counted from before the file is locked: if this future is dropped, the blocking call
        // still finishes, and the file and the count go together when its result is dropped.
        let count = Count::new(&self.inner);
        let work = tokio::task::spawn_blocking(move || {
            let Some((mut file, id)) =
                take(&lock, sharing).map_err(|e| io_error("cannot lock", &lock, &e))?
            else {
                return Ok(None);
            };
            write_owner(&mut file, &owner).map_err(|e| io_error("cannot write", &lock, &e))?;
            let token =
                next_token(&fence, sharing).map_err(|e| io_error("cannot update", &fence, &e))?;
            Ok::<_, Error>(Some((file, id, token, lock, count)))
        });
        let taken = work.await.map_err(|e| {
            Error::new(ErrorKind::Backend, NAME, format!("lock task failed: {e}"))
        })??;
        Ok(taken.map(|t| self.grant(&req, t)))
    }

    async fn wait_lock(&self, _req: LockRequest<'_>, _deadline: Instant) -> Result<Waited, Error> {
        Err(Error::no_native_wait(
            NAME,
            "file locks have no cancellable native wait",
        ))
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        // Without state the acquisition never finished: its file, if it locked one, is closed
        // with the dropped blocking task's result.
        let Some(locked) = held.state::<Arc<Locked>>() else {
            return Ok(false);
        };
        let ours = locked.still_ours();
        // Closing the file releases the lock.
        drop(
            locked
                .file
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        Ok(ours)
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        Ok(req
            .held
            .state::<Arc<Locked>>()
            .filter(|l| l.still_ours())
            .map(|_| req.ttl_validity()))
    }

    /// No batch request here: each grant in turn.
    async fn extend_many(
        &self,
        reqs: &[leasehold_core::ExtendRequest<'_>],
    ) -> Vec<leasehold_core::Extended> {
        leasehold_core::extend_each(self, reqs).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        let (lock, fence) = (self.lock_path(key), self.fence_path(key));
        let sharing = self.inner.config.sharing;
        let found = tokio::task::spawn_blocking(move || -> io::Result<Option<HolderInfo>> {
            let Some(mut file) = folder::open_read(&lock, sharing)? else {
                return Ok(None);
            };
            match file.try_lock_shared() {
                Ok(()) => return Ok(None), // nobody holds it (closing the file unlocks)
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => return Err(e),
            }
            // What a holder wrote: bounded, since anyone able to write the file chose it.
            let owner = folder::read_bounded(&mut file)?;
            let mut info =
                HolderInfo::unknown().with_detail(format!("lock file {}", lock.display()));
            if !owner.is_empty() {
                info = info.with_owner(Owner::from_raw(owner));
            }
            // A counter that cannot be opened or read is an error (at the open-file limit it
            // used to pass for a holder without a token); one that does not parse is no token.
            if let Some(mut f) = folder::open_read(&fence, sharing)?
                && let Ok(t) = folder::read_bounded(&mut f)?.trim().parse()
            {
                info = info.with_fencing(FencingToken::new(t));
            }
            Ok(Some(info))
        });
        found
            .await
            .map_err(|e| {
                Error::new(
                    ErrorKind::Backend,
                    NAME,
                    format!("inspect task failed: {e}"),
                )
            })?
            .map_err(|e| io_error("cannot inspect", &self.lock_path(key), &e))
    }
}

#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;
