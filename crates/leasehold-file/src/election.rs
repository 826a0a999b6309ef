//! Elections on the file backend: the leadership is a lock file (`flock`) of its own.
//!
//! An election keeps its files in the subfolder `elections` of the lock folder (a name no
//! lock file can have: those end in `.lock` or `.fence`), laid out as locks are: the leader
//! file `elections/<name>.lock` (held with `flock` while leading, so a crashed leader's lock
//! ends with its process), the key's fence counter `elections/<name>.fence` (the term) and the
//! value in the side file `elections/<name>.leader` (`<owner>\n<value>`, written to a temporary
//! file and renamed over, so a reader never sees half of it). Watching polls.

use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Candidate, Error, ErrorKind, LeaderStore, LockKey, Owner, async_trait};

use crate::folder::{self, Sharing};

/// The subfolder of elections.
pub(crate) const SUBFOLDER: &str = "elections";

/// How often an observer reads the leader.
pub(crate) const POLL: Duration = Duration::from_millis(50);

/// The longest side file read: an owner, a newline and the longest candidate value.
const SIDE_LIMIT: u64 = 4096 + 256;

/// Maps a key to its side file.
pub(crate) type SidePath = Arc<dyn Fn(&LockKey) -> PathBuf + Send + Sync>;

/// The side files of one election folder.
pub(crate) struct FileLeaders {
    path: SidePath,
    sharing: Sharing,
}

impl std::fmt::Debug for FileLeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileLeaders").finish_non_exhaustive()
    }
}

impl FileLeaders {
    pub(crate) fn new(path: SidePath, sharing: Sharing) -> Self {
        Self { path, sharing }
    }

    fn read_now(&self, key: &LockKey) -> io::Result<Option<(Owner, Candidate)>> {
        let Some(file) = folder::open_read(&(self.path)(key), self.sharing)? else {
            return Ok(None);
        };
        let mut text = String::new();
        file.take(SIDE_LIMIT).read_to_string(&mut text)?;
        Ok(text.split_once('\n').and_then(|(owner, value)| {
            Candidate::new(value)
                .ok()
                .map(|v| (Owner::from_raw(owner), v))
        }))
    }
}

#[async_trait]
impl LeaderStore for FileLeaders {
    async fn publish(&self, key: &LockKey, owner: &Owner, value: &Candidate) -> Result<(), Error> {
        let path = (self.path)(key);
        let tmp = path.with_extension(format!("leader.{}", owner.as_str()));
        let text = format!("{}\n{}", owner.as_str(), value.as_str());
        let written = tokio::task::spawn_blocking(move || -> io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        })
        .await
        .map_err(|e| Error::new(ErrorKind::Backend, crate::NAME, e.to_string()))?;
        written.map_err(|e| crate::io_error("writing the leader file", &(self.path)(key), &e))
    }

    async fn read(&self, key: &LockKey) -> Result<Option<(Owner, Candidate)>, Error> {
        self.read_now(key)
            .map_err(|e| crate::io_error("reading the leader file", &(self.path)(key), &e))
    }

    async fn clear(&self, key: &LockKey, owner: &Owner) -> Result<(), Error> {
        // Called while we still hold the leader file, so no other leader writes meanwhile.
        if let Some((o, _)) = self.read(key).await?
            && o == *owner
        {
            let path = (self.path)(key);
            std::fs::remove_file(&path)
                .map_err(|e| crate::io_error("removing the leader file", &path, &e))?;
        }
        Ok(())
    }
}
