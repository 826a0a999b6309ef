//! How a [`LockKey`] maps to Redis keys (documented in the crate docs; stable).

use leasehold_core::{Error, ErrorKind, LockKey};

/// The default prefix of every Redis key leasehold writes.
pub const DEFAULT_PREFIX: &str = "leasehold:";

/// The Redis names of one lock: `<prefix>{<key>}`, `<prefix>{<key>}:fence` and the wake-up
/// channel `<prefix>{<key>}:released`. The braces make them one hash tag, so on a Redis Cluster
/// all three live on one slot.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    pub(crate) lock: String,
    pub(crate) fence: String,
    pub(crate) channel: String,
    /// Fair mode: the list of queued owner values, in arrival order.
    pub(crate) queue: String,
    /// Fair mode: owner value → server time (ms) until which that waiter counts as alive.
    pub(crate) waiters: String,
}

impl Names {
    pub(crate) fn new(prefix: &str, key: &LockKey) -> Self {
        let lock = format!("{prefix}{{{}}}", key.as_str());
        Self {
            fence: format!("{lock}:fence"),
            channel: format!("{lock}:released"),
            queue: format!("{lock}:queue"),
            waiters: format!("{lock}:waiters"),
            lock,
        }
    }
}

/// Checks a prefix: braces would move the hash tag, so they are refused.
pub(crate) fn check_prefix(backend: &'static str, prefix: &str) -> Result<(), Error> {
    if prefix.contains(['{', '}']) {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            backend,
            format!("key prefix {prefix:?} must not contain braces: they would move the hash tag"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_one_hash_tag() -> Result<(), leasehold_core::KeyError> {
        let n = Names::new("leasehold:", &LockKey::new("jobs/nightly")?);
        assert_eq!(n.lock, "leasehold:{jobs/nightly}");
        assert_eq!(n.fence, "leasehold:{jobs/nightly}:fence");
        assert_eq!(n.channel, "leasehold:{jobs/nightly}:released");
        assert!(check_prefix("redis", "a{b").is_err());
        Ok(())
    }
}
