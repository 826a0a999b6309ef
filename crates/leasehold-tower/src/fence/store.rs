use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use leasehold_core::{Error, FencingToken, async_trait};

/// The verdict of a [`FenceStore`] on one token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// The token is at least the highest seen for the resource; it is now the highest.
    Accepted,
    /// A higher token was already accepted.
    Stale {
        /// The highest accepted token.
        highest: FencingToken,
    },
}

/// Remembers, per resource, the highest fencing token accepted, and admits a token only if it
/// is not lower. Equal tokens are admitted: one lease may write several times.
///
/// `admit` must be atomic per resource: check and record in one step, so two concurrent
/// requests cannot both pass with out-of-order tokens.
#[async_trait]
pub trait FenceStore: Send + Sync + 'static {
    /// Admits `token` for `resource` (recording it as the highest) or says it is stale.
    async fn admit(&self, resource: &str, token: FencingToken) -> Result<Admission, Error>;
}

/// The in-memory [`FenceStore`]: right for one process owning the resource. Replicas that
/// share a resource need a shared store (`PostgresFenceStore` with the `postgres` feature).
#[derive(Debug, Default)]
pub struct MemoryFenceStore {
    highest: Mutex<HashMap<String, FencingToken>>,
}

impl MemoryFenceStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The highest token accepted for `resource`.
    pub fn highest(&self, resource: &str) -> Option<FencingToken> {
        self.highest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(resource)
            .copied()
    }
}

#[async_trait]
impl FenceStore for MemoryFenceStore {
    async fn admit(&self, resource: &str, token: FencingToken) -> Result<Admission, Error> {
        let mut map = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(resource) {
            Some(&highest) if token < highest => Ok(Admission::Stale { highest }),
            _ => {
                map.insert(resource.to_owned(), token);
                Ok(Admission::Accepted)
            }
        }
    }
}
