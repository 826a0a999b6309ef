//! Deleting the lock files nobody holds ([`FileBackend::prune`](crate::FileBackend::prune)),
//! without ever letting two holders in.
//!
//! The standard recipe: lock the file (`LOCK_EX | LOCK_NB`; a held one is skipped), check that
//! the path still names the file we locked, and unlink it **while holding the lock**. A process
//! that opened the file before the unlink and locks it after we let go holds a lock on a deleted
//! file; the backend's acquire makes the same check after locking (the path must still name the
//! file it locked), sees the file gone, and opens the path again. Fence files are never touched:
//! deleting one restarts the key's tokens at 1.

use std::fs::{self, TryLockError};
use std::io;
use std::path::Path;

use crate::folder::{self, Sharing};
use crate::folder::{identity, identity_at};

/// What [`FileBackend::prune`](crate::FileBackend::prune) did in the folder.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pruned {
    /// Lock files deleted: nobody held them.
    pub removed: usize,
    /// Lock files kept because a holder has them locked (or someone else deleted or replaced
    /// them while we looked).
    pub held: usize,
    /// Lock files that could not be checked or deleted (not ours in a private folder, not a
    /// regular file, no permission): left as they are.
    pub failed: usize,
}

/// Prunes every `*.lock` file directly in `dir`.
pub(crate) fn prune_dir(dir: &Path, sharing: Sharing) -> io::Result<Pruned> {
    let mut pruned = Pruned::default();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let is_lock = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.ends_with(".lock") && !n.starts_with('.'));
        if !is_lock {
            continue;
        }
        match prune_one(&entry.path(), sharing) {
            Ok(true) => pruned.removed += 1,
            Ok(false) => pruned.held += 1,
            Err(_) => pruned.failed += 1,
        }
    }
    Ok(pruned)
}

/// Deletes one lock file if nobody holds it: `Ok(true)` if we deleted it, `Ok(false)` if it
/// is held, or was deleted or replaced by someone else meanwhile.
pub(crate) fn prune_one(lock: &Path, sharing: Sharing) -> io::Result<bool> {
    // No symbolic link is followed, and only a regular file with one link (ours, in a private
    // folder) is considered.
    let Some(file) = folder::open_read(lock, sharing)? else {
        return Ok(false);
    };
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(false),
        Err(TryLockError::Error(e)) => return Err(e),
    }
    // Deleted or replaced since we opened it: a new file may be someone's; leave it.
    match identity_at(lock) {
        Ok(at_path) if at_path == identity(&file.metadata()?) => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    }
    fs::remove_file(lock)?;
    // Closing the file releases the lock, on a file no path names any more.
    drop(file);
    Ok(true)
}
