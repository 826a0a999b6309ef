//! The opt-in expiry of fence counters (see "What keys leave behind" in the crate docs).

use std::time::Duration;

use leasehold_core::{Error, ErrorKind};

use crate::RedisConfig;
use crate::config::REDIS;
use crate::node::ttl_ms;

/// How long a fence counter lives: for ever (`None`), or this long after the latest
/// acquisition of its key ([`RedisConfig::with_fence_ttl`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FenceExpiry(pub(crate) Option<Duration>);

impl FenceExpiry {
    /// The scripts' argument: milliseconds, `0` for none.
    pub(crate) fn arg(self) -> u64 {
        self.0.map_or(0, ttl_ms)
    }
}

impl RedisConfig {
    /// Opt-in: each key's fence counter expires `ttl` after the key's latest acquisition, so
    /// that keys no longer used leave nothing behind (by default a counter is kept for ever;
    /// see "What keys leave behind" in the [crate docs](crate)). A counter that starts again
    /// starts at the server's clock in microseconds, so tokens still increase across the
    /// expiry as long as the server's clock never steps back by more than `ttl`: choose it well
    /// above any clock step (an hour or a day). Every client of the keys must use the option
    /// (one without it restarts an expired counter at 1). At least 1 s.
    pub fn with_fence_ttl(mut self, ttl: Duration) -> Result<Self, Error> {
        if ttl < Duration::from_secs(1) {
            return Err(Error::new(
                ErrorKind::InvalidConfig,
                REDIS,
                format!("fence counter expiry {ttl:?} is below the minimum of 1s"),
            ));
        }
        self.fence_ttl = Some(ttl);
        Ok(self)
    }
}
