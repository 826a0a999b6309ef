//! The lock folder and its files, on a host shared with other users: where the default folder
//! is, which folders are accepted, and how lock and fence files are opened, locked, read and
//! written.

use std::fs::{self, DirBuilder, File, OpenOptions, Permissions, TryLockError};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use leasehold_core::Owner;
use nix::libc;

/// The most [`read_bounded`] reads of a lock file's owner value or a fence file's counter.
pub(crate) const READ_LIMIT: u64 = 256;

/// The user whose files these are: the effective user id (the owner of what we create).
pub(crate) fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The per-user default folder: `/var/tmp/leasehold-<uid>`.
pub(crate) fn per_user_dir() -> PathBuf {
    PathBuf::from(format!("/var/tmp/leasehold-{}", euid()))
}

/// Whether the folder is private to its user (the default) or shared by several users.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sharing {
    Private,
    Shared,
}

const GROUP_OTHER_WRITE: u32 = 0o022;
const OTHER_WRITE: u32 = 0o002;
const STICKY: u32 = 0o1000;

/// Creates (private mode, mode 0700) or finds the lock folder, and refuses one that others
/// could tamper with. The message says why and what to do.
pub(crate) fn prepare(dir: &Path, sharing: Sharing) -> Result<(), String> {
    if sharing == Sharing::Private {
        if let Some(parent) = dir.parent() {
            fs::create_dir_all(parent)
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        match DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(format!(
                    "cannot create the lock folder {}: {e}",
                    dir.display()
                ));
            }
        }
    }
    check(dir, sharing)
}

/// The checks of [`prepare`] on an existing folder.
fn check(dir: &Path, sharing: Sharing) -> Result<(), String> {
    let shown = dir.display();
    let meta = fs::symlink_metadata(dir)
        .map_err(|e| format!("cannot use the lock folder {shown}: {e}"))?;
    if meta.file_type().is_symlink() {
        return Err(format!(
            "the lock folder {shown} is a symbolic link: refused (give the real path)"
        ));
    }
    if !meta.is_dir() {
        return Err(format!("the lock folder {shown} is not a folder"));
    }
    let mode = meta.mode();
    match sharing {
        Sharing::Private => {
            if meta.uid() != euid() {
                return Err(format!(
                    "the lock folder {shown} belongs to user {}, not to us (user {}): refused; \
                     another user may have created it first. Use a folder of your own, or a \
                     shared folder with ?shared=true",
                    meta.uid(),
                    euid()
                ));
            }
            if mode & GROUP_OTHER_WRITE != 0 {
                return Err(format!(
                    "the lock folder {shown} is writable by other users (mode {:o}): refused; \
                     `chmod go-w` it, or use a shared folder with ?shared=true",
                    mode & 0o7777
                ));
            }
        }
        Sharing::Shared => {
            if mode & OTHER_WRITE != 0 && mode & STICKY == 0 {
                return Err(format!(
                    "the shared lock folder {shown} is writable by every user without the \
                     sticky bit (mode {:o}): anyone could replace a lock file; refused \
                     (`chmod +t` it, or close it to other users)",
                    mode & 0o7777
                ));
            }
        }
    }
    // Whoever can rename entries of the parent can swap the whole folder.
    if let Some(parent) = dir.parent()
        && let Ok(p) = fs::metadata(parent)
        && p.mode() & GROUP_OTHER_WRITE != 0
        && p.mode() & STICKY == 0
    {
        return Err(format!(
            "the folder above the lock folder, {}, is writable by other users without the \
             sticky bit (mode {:o}): they could replace the lock folder; refused",
            parent.display(),
            p.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Opens a lock or fence file for reading and writing, creating it if missing (mode 0600, or
/// 0660 in a shared folder), without following a symbolic link, and checks with `fstat` that
/// it is a regular file with one link, owned by us (in a private folder). Only then may it be
/// written: so a file planted under its name (a link to another file, a device, a FIFO, a
/// file of another user) is never written, nor truncated.
pub(crate) fn open_rw(path: &Path, sharing: Sharing) -> io::Result<File> {
    let mode = match sharing {
        Sharing::Private => 0o600,
        Sharing::Shared => 0o660,
    };
    let flags = libc::O_NOFOLLOW | libc::O_NONBLOCK;
    loop {
        match OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(path)
        {
            Ok(f) => {
                if verify(&f, sharing)? {
                    return Ok(f);
                }
                // Unlinked since we opened it (a prune): open the path again.
                continue;
            }
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(explain(e)),
            Err(_) => {}
        }
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(flags)
            .open(path)
        {
            Ok(f) => {
                if sharing == Sharing::Shared {
                    // The umask may have taken the group's write bit: the group needs it.
                    f.set_permissions(Permissions::from_mode(mode))?;
                }
                if verify(&f, sharing)? {
                    return Ok(f);
                }
            }
            // Created by someone else meanwhile: open theirs.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Opens a lock file to read it (for `inspect`), with the same checks as [`open_rw`] but
/// creating nothing: `None` if there is no file.
pub(crate) fn open_read(path: &Path, sharing: Sharing) -> io::Result<Option<File>> {
    match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        // Unlinked since we opened it (a prune): as good as missing.
        Ok(f) => Ok(verify(&f, sharing)?.then_some(f)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(explain(e)),
    }
}

/// `fstat` checks: a regular file, one link, ours (in a private folder). `Ok(false)` for a file
/// with no link left: unlinked (by a prune) since it was opened.
fn verify(file: &File, sharing: Sharing) -> io::Result<bool> {
    let meta = file.metadata()?;
    let refuse = |why: String| Err(io::Error::new(io::ErrorKind::PermissionDenied, why));
    if !meta.is_file() {
        return refuse("not a regular file: refused".into());
    }
    if meta.nlink() == 0 {
        return Ok(false);
    }
    if meta.nlink() != 1 {
        return refuse(format!(
            "has {} hard links (a lock file has one): refused",
            meta.nlink()
        ));
    }
    if sharing == Sharing::Private && meta.uid() != euid() {
        return refuse(format!(
            "belongs to user {}, not to us (user {}): refused",
            meta.uid(),
            euid()
        ));
    }
    Ok(true)
}

/// A clearer message for a refused symbolic link (`ELOOP` from `O_NOFOLLOW`).
fn explain(e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            "is a symbolic link: refused",
        )
    } else {
        e
    }
}

/// Reads at most [`READ_LIMIT`] bytes as text; `Err(InvalidData)` if there is more.
pub(crate) fn read_bounded(file: &mut File) -> io::Result<String> {
    let mut text = String::new();
    Read::by_ref(file)
        .take(READ_LIMIT + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > READ_LIMIT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("holds more than {READ_LIMIT} bytes: not written by leasehold"),
        ));
    }
    Ok(text)
}

/// A file's identity: its device and inode.
pub(crate) fn identity(m: &fs::Metadata) -> (u64, u64) {
    (m.dev(), m.ino())
}

/// The identity of the file at `path` (not following a symbolic link).
pub(crate) fn identity_at(path: &Path) -> io::Result<(u64, u64)> {
    fs::symlink_metadata(path).map(|m| identity(&m))
}

/// Opens and locks `lock`; `None` if another holder has it. Retries when the file locked is no
/// longer the one at the path (deleted or replaced meanwhile).
pub(crate) fn take(lock: &Path, sharing: Sharing) -> io::Result<Option<(File, (u64, u64))>> {
    for _ in 0..16 {
        let file = open_rw(lock, sharing)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Ok(None),
            Err(TryLockError::Error(e)) => return Err(e),
        }
        let ours = identity(&file.metadata()?);
        match identity_at(lock) {
            Ok(at_path) if at_path == ours => return Ok(Some((file, ours))),
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(
        "the lock file keeps being replaced while we lock it",
    ))
}

/// Next fencing token: read, increment, write back and fsync, under the lock.
pub(crate) fn next_token(fence: &Path, sharing: Sharing) -> io::Result<u64> {
    bump(&mut open_rw(fence, sharing)?)
}

/// Reads, increments, writes back and fsyncs the counter in `f`.
pub(crate) fn bump(f: &mut File) -> io::Result<u64> {
    let text = read_bounded(f)?;
    let last: u64 = if text.trim().is_empty() {
        0
    } else {
        text.trim().parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("fence file holds {text:?}, not a number"),
            )
        })?
    };
    let next = last
        .checked_add(1)
        .ok_or_else(|| io::Error::other("fence counter exhausted"))?;
    f.set_len(0)?;
    f.rewind()?;
    f.write_all(next.to_string().as_bytes())?;
    f.sync_data()?;
    Ok(next)
}

/// Writes `owner` as the lock file's whole content, for `inspect`.
pub(crate) fn write_owner(file: &mut File, owner: &Owner) -> io::Result<()> {
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(owner.as_str().as_bytes())
}
