//! How a [`LockKey`] maps to Redis keys (documented in the crate docs; stable).

use std::fmt;
use std::io::Write as _;

use leasehold_core::{Error, ErrorKind, LockKey};
use redis::{RedisWrite, ToRedisArgs, ToSingleRedisArg};

/// The default prefix of every Redis key leasehold writes.
pub const DEFAULT_PREFIX: &str = "leasehold:";

/// The Redis names of one lock: `<prefix>{<key>}`, `<prefix>{<key>}:fence` and the wake-up
/// channel `<prefix>{<key>}:released`. The braces make them one hash tag, so on a Redis Cluster
/// all three live on one slot.
///
/// Only the lock name is stored; the others are written straight into a command's buffer from
/// it ([`Derived`]), so naming a lock costs one allocation per request, not five.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    lock: String,
}

/// Suffixes of the derived names.
const FENCE: &str = ":fence";
const CHANNEL: &str = ":released";
const QUEUE: &str = ":queue";
const WAITERS: &str = ":waiters";
const WAITING: &str = ":waiting";

impl Names {
    pub(crate) fn new(prefix: &str, key: &LockKey) -> Self {
        let key = key.as_str();
        let mut lock = String::with_capacity(prefix.len() + key.len() + 2);
        lock.push_str(prefix);
        lock.push('{');
        lock.push_str(key);
        lock.push('}');
        Self { lock }
    }

    /// The lock: a string holding the owner value, with a TTL.
    pub(crate) fn lock(&self) -> &str {
        &self.lock
    }

    /// The fence counter (single node).
    pub(crate) fn fence(&self) -> Derived<'_> {
        self.derived(FENCE)
    }

    /// The wake-up channel the release script publishes on.
    pub(crate) fn channel(&self) -> Derived<'_> {
        self.derived(CHANNEL)
    }

    /// Fair mode: the list of queued owner values, in arrival order.
    pub(crate) fn queue(&self) -> Derived<'_> {
        self.derived(QUEUE)
    }

    /// Fair mode: owner value → server time (ms) until which that waiter counts as alive.
    pub(crate) fn waiters(&self) -> Derived<'_> {
        self.derived(WAITERS)
    }

    /// Plain mode: set (with a short TTL) by a waiter whose attempt found the lock held; a
    /// release publishes a wake-up only while it exists.
    pub(crate) fn waiting(&self) -> Derived<'_> {
        self.derived(WAITING)
    }

    fn derived(&self, suffix: &'static str) -> Derived<'_> {
        Derived {
            lock: &self.lock,
            suffix,
        }
    }
}

/// A name derived from a lock name (`<lock><suffix>`), written into a command without an
/// intermediate `String`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Derived<'a> {
    lock: &'a str,
    suffix: &'static str,
}

impl fmt::Display for Derived<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.lock)?;
        f.write_str(self.suffix)
    }
}

impl ToRedisArgs for Derived<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        // Writing into a command's in-memory buffer cannot fail.
        let _ = arg.write_all(self.lock.as_bytes());
        let _ = arg.write_all(self.suffix.as_bytes());
    }
}

impl ToSingleRedisArg for Derived<'_> {}

/// Checks a prefix: braces would move the hash tag, so they are refused.
pub(crate) fn check_prefix(backend: &'static str, prefix: String) -> Result<String, Error> {
    if prefix.contains(['{', '}']) {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            backend,
            format!("key prefix {prefix:?} must not contain braces: they would move the hash tag"),
        ));
    }
    Ok(prefix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_share_one_hash_tag() -> Result<(), leasehold_core::KeyError> {
        let n = Names::new("leasehold:", &LockKey::new("jobs/nightly")?);
        assert_eq!(n.lock(), "leasehold:{jobs/nightly}");
        assert_eq!(n.fence().to_string(), "leasehold:{jobs/nightly}:fence");
        assert_eq!(n.channel().to_string(), "leasehold:{jobs/nightly}:released");
        assert_eq!(n.queue().to_string(), "leasehold:{jobs/nightly}:queue");
        assert_eq!(n.waiters().to_string(), "leasehold:{jobs/nightly}:waiters");
        assert_eq!(n.waiting().to_string(), "leasehold:{jobs/nightly}:waiting");
        // Written into a command, a derived name is one argument with the same bytes.
        let mut args: Vec<Vec<u8>> = Vec::new();
        n.fence().write_redis_args(&mut args);
        n.channel().write_redis_args(&mut args);
        assert_eq!(
            args,
            [
                b"leasehold:{jobs/nightly}:fence".to_vec(),
                b"leasehold:{jobs/nightly}:released".to_vec()
            ]
        );
        assert!(check_prefix("redis", "a{b".to_owned()).is_err());
        Ok(())
    }
}
