//! A minimal fenced resource, for checking fencing tokens in tests.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use leasehold_core::FencingToken;

/// A resource that remembers the highest fencing token it has accepted per name and rejects any
/// lower one, as a real store must (DESIGN.md point 2).
#[derive(Debug, Default)]
pub struct FencedResource {
    highest: Mutex<HashMap<String, u64>>,
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
        let mut map = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        let seen = map.entry(name.to_owned()).or_insert(0);
        if token.get() < *seen {
            return Err(StaleToken {
                given: token.get(),
                seen: *seen,
            });
        }
        *seen = token.get();
        Ok(())
    }
}
