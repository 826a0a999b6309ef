//! Semaphores on one host: [`FilePermits`], N slot files per key.

use std::fs::{File, TryLockError};
use std::io::{self, Seek, Write};
use std::path::{Path, PathBuf};

use leasehold_core::semaphore::limit_mismatch;
use leasehold_core::{
    Error, Grant, HolderInfo, LockBackend, LockKey, LockRequest, Owner, PermitBackend, PermitLimit,
    View, Waited, async_trait,
};
use rand::Rng;
use tokio::time::Instant;

use crate::folder::{self, Sharing, bump, take, write_owner};
use crate::{Count, FileBackend, NAME, Taken, blocking, file_name, io_error};

/// The file backend's permit view: permit `i` of `key` is an exclusive `flock` of the slot file
/// `<dir>/<name>~sem<i>.lock` (`<name>` as for locks).
///
/// - **Names.** A lock's file name never holds `~` except before the 32 hex digits of a long
///   name's hash, so no lock file is ever a slot file. `flock -n <dir>/<name>~sem0.lock …`
///   takes slot 0 by hand.
/// - **Slots** are tried from a random start; a crashed holder's permit comes back at once
///   (the kernel drops its lock), as for locks.
/// - **Tokens** come from `<dir>/<name>~sem.fence`, incremented under its own `flock`: strictly
///   increasing across every permit of the key, durable.
/// - **Limit.** The first client writes N into `<dir>/<name>~sem.limit` (under its `flock`);
///   every client checks its N against it and is refused when they differ ([`limit_mismatch`]).
///   The file stays: to change N, delete it while nobody holds a permit.
/// - Waiting polls, as for locks.
#[derive(Debug, Clone)]
pub struct FilePermits {
    backend: FileBackend,
    limit: PermitLimit,
}

impl FilePermits {
    pub(crate) fn new(backend: FileBackend, limit: PermitLimit) -> Self {
        Self { backend, limit }
    }

    fn path(&self, key: &LockKey, what: &str) -> PathBuf {
        self.backend
            .inner
            .config
            .dir
            .join(format!("{}~sem{what}", file_name(key)))
    }

    fn slot(&self, key: &LockKey, i: u32) -> PathBuf {
        self.path(key, &format!("{i}.lock"))
    }

    fn sharing(&self) -> Sharing {
        self.backend.inner.config.sharing
    }
}

/// Stores `limit` in the limit file if it is empty; else compares: the stored limit.
fn agree(path: &Path, sharing: Sharing, limit: u32) -> io::Result<u32> {
    let mut f = folder::open_rw(path, sharing)?;
    f.lock()?;
    let text = folder::read_bounded(&mut f)?;
    if let Ok(stored) = text.trim().parse::<u32>() {
        return Ok(stored);
    }
    f.set_len(0)?;
    f.rewind()?;
    f.write_all(limit.to_string().as_bytes())?;
    f.sync_data()?;
    Ok(limit)
}

/// The owner written in a held slot file, or `None` when the slot is free.
fn holder_of(path: &Path, sharing: Sharing) -> io::Result<Option<String>> {
    let Some(mut file) = folder::open_read(path, sharing)? else {
        return Ok(None);
    };
    match file.try_lock_shared() {
        Ok(()) => Ok(None),
        Err(TryLockError::WouldBlock) => folder::read_bounded(&mut file).map(Some),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

#[async_trait]
impl View for FilePermits {
    type Grants = FileBackend;
    const REFUSAL: &'static str = "a permit view is already a semaphore";

    /// A permit is a locked slot file of the backend's folder: released, renewed and lost as
    /// a lock file is.
    fn grants(&self) -> &FileBackend {
        &self.backend
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        let n = self.limit.get();
        let (limit_file, fence) = (self.path(req.key, ".limit"), self.path(req.key, ".fence"));
        let slots: Vec<PathBuf> = (0..n).map(|i| self.slot(req.key, i)).collect();
        let (sharing, owner) = (self.sharing(), req.owner.clone());
        let start = rand::rng().random_range(0..n) as usize;
        // Counted from before a file is locked, as for locks: dropped with the task's result.
        let count = Count::new(&self.backend.inner);
        let key = req.key.clone();
        let taken = blocking(move || -> Result<Option<Taken>, Error> {
            let stored = agree(&limit_file, sharing, n)
                .map_err(|e| io_error("cannot read or write", &limit_file, &e))?;
            if stored != n {
                return Err(limit_mismatch(NAME, &key, stored, n));
            }
            for i in 0..slots.len() {
                let path = &slots[(start + i) % slots.len()];
                let Some((mut file, id)) =
                    take(path, sharing).map_err(|e| io_error("cannot lock", path, &e))?
                else {
                    continue;
                };
                write_owner(&mut file, &owner).map_err(|e| io_error("cannot write", path, &e))?;
                let token = folder::open_rw(&fence, sharing)
                    .and_then(|mut f: File| {
                        f.lock()?;
                        bump(&mut f)
                    })
                    .map_err(|e| io_error("cannot update", &fence, &e))?;
                return Ok(Some((file, id, token, path.clone(), count)));
            }
            Ok(None)
        })
        .await?;
        Ok(taken.map(|t| self.backend.grant(&req, t)))
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        self.backend.wait_lock(req, deadline).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        Ok(self.holders(key).await?.into_iter().next())
    }
}

#[async_trait]
impl PermitBackend for FilePermits {
    fn limit(&self) -> PermitLimit {
        self.limit
    }

    async fn holders(&self, key: &LockKey) -> Result<Vec<HolderInfo>, Error> {
        let slots: Vec<PathBuf> = (0..self.limit.get()).map(|i| self.slot(key, i)).collect();
        let sharing = self.sharing();
        blocking(move || {
            let mut out = Vec::new();
            for path in &slots {
                let owner =
                    holder_of(path, sharing).map_err(|e| io_error("cannot inspect", path, &e))?;
                if let Some(owner) = owner {
                    let mut info =
                        HolderInfo::unknown().with_detail(format!("slot file {}", path.display()));
                    if !owner.is_empty() {
                        info = info.with_owner(Owner::from_raw(owner));
                    }
                    out.push(info);
                }
            }
            Ok(out)
        })
        .await
    }
}
