//! How long a grant is good for, as a backend reports it.

use std::time::Duration;

use tokio::time::Instant;

/// How long a grant is good for: `ttl` counted from the monotonic instant `from`.
///
/// The lease's deadline is `from + ttl − drift(ttl)` (see [`Drift`](crate::Drift)); backends
/// report the raw figures and the [`Locker`](crate::Locker) subtracts the drift margin once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// When the grant's lifetime started, conservatively: before the request was sent.
    pub from: Instant,
    /// How long it lasts from then.
    pub ttl: Duration,
}

impl Validity {
    /// A validity of `ttl` from `from`.
    pub const fn new(from: Instant, ttl: Duration) -> Self {
        Self { from, ttl }
    }
}
