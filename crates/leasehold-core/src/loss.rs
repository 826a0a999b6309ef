//! Why a lease ended.

use std::fmt;
use std::sync::Arc;

/// Why a lease is no longer held.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The validity deadline passed without a successful renewal.
    Expired,
    /// The backend says our grant is gone (expired on the server, or someone else holds it).
    NotHeld,
    /// Renewal kept failing until the validity deadline passed; the last error.
    RenewalFailed(Arc<str>),
    /// The backend reported the loss itself (a dead session, a revoked lease).
    Backend(Arc<str>),
    /// We released it (or dropped the [`Lease`](crate::Lease)).
    Released,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Expired => f.write_str("validity deadline passed"),
            Self::NotHeld => f.write_str("the backend no longer holds our grant"),
            Self::RenewalFailed(e) => write!(f, "renewal failed: {e}"),
            Self::Backend(e) => write!(f, "{e}"),
            Self::Released => f.write_str("released"),
        }
    }
}
