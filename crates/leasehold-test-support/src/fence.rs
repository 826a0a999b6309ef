//! A minimal fenced resource, for checking fencing tokens in tests: the core's
//! [`MemoryFenceStore`] with a synchronous, `Result`-shaped write.

use leasehold_core::{Admission, FencingToken, MemoryFenceStore};

/// A resource that remembers the highest fencing token it has accepted per name and rejects any
/// lower one, as a real store must: a paused holder's late write carries an old token.
#[derive(Debug, Default)]
pub struct FencedResource {
    store: MemoryFenceStore,
}

/// A write rejected because a newer holder has already written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleToken {
    /// The token of the rejected write.
    pub given: u64,
    /// The highest token already accepted.
    pub seen: u64,
}

impl FencedResource {
    /// An empty resource.
    pub fn new() -> Self {
        Self::default()
    }

    /// Accepts a write to `name` with `token` unless a higher token was already accepted.
    pub fn write(&self, name: &str, token: FencingToken) -> Result<(), StaleToken> {
        match self.store.admit_now(name, token) {
            Admission::Accepted => Ok(()),
            Admission::Stale { highest } => Err(StaleToken {
                given: token.get(),
                seen: highest.get(),
            }),
        }
    }
}
