//! The resource side of fencing: a [`FenceStore`] remembers the highest [`FencingToken`]
//! accepted per resource and rejects a lower one.
//!
//! This is the check that makes a lost lease harmless: a holder paused past its lease comes
//! back with an old token, and the resource, having already accepted a newer one, refuses its
//! write. [`MemoryFenceStore`] is the store for one process owning the resource; drivers offer
//! shared stores (PostgreSQL) for replicas, and `leasehold-tower`'s `FenceLayer` puts any store
//! in front of a service.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;

use crate::error::Error;
use crate::token::FencingToken;

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
/// share a resource need a shared store (the PostgreSQL driver has one).
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

    /// [`FenceStore::admit`] without the future: the in-memory store never waits or fails.
    pub fn admit_now(&self, resource: &str, token: FencingToken) -> Admission {
        let mut map = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(resource) {
            Some(&highest) if token < highest => Admission::Stale { highest },
            _ => {
                map.insert(resource.to_owned(), token);
                Admission::Accepted
            }
        }
    }
}

#[async_trait]
impl FenceStore for MemoryFenceStore {
    async fn admit(&self, resource: &str, token: FencingToken) -> Result<Admission, Error> {
        Ok(self.admit_now(resource, token))
    }
}

#[cfg(test)]
mod tests {
    use super::{Admission, FenceStore, FencingToken, MemoryFenceStore};

    #[tokio::test]
    async fn lower_tokens_are_stale_equal_ones_admitted() {
        let store = MemoryFenceStore::new();
        let t = FencingToken::new;
        assert_eq!(store.admit("r", t(5)).await.ok(), Some(Admission::Accepted));
        assert_eq!(store.admit("r", t(5)).await.ok(), Some(Admission::Accepted));
        assert_eq!(
            store.admit("r", t(4)).await.ok(),
            Some(Admission::Stale { highest: t(5) })
        );
        assert_eq!(store.admit_now("other", t(1)), Admission::Accepted);
        assert_eq!(store.admit_now("r", t(7)), Admission::Accepted);
        assert_eq!(store.highest("r"), Some(t(7)));
        assert_eq!(store.highest("none"), None);
    }
}
