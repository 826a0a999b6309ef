//! The one mapping of redis-rs errors to leasehold's: what a caller can match on and whether
//! retrying can help.

use leasehold_core::{Error, ErrorKind};
use redis::RedisError;

/// Server error codes that say "not now" rather than "never": a script running too long
/// (`BUSY`), a dataset still loading (`LOADING`), a cluster slot migrating or failing over
/// (`TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`), fewer replicas in sync than
/// `min-replicas-to-write` asks for (`NOREPLICAS`: a replica lagging or reconnecting).
const TRANSIENT_CODES: [&str; 6] = [
    "BUSY",
    "LOADING",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "NOREPLICAS",
];

/// Whether the server answered one of [`TRANSIENT_CODES`]; for a pipeline (a pipelined acquire
/// fails as a whole, its error carrying each failed command's), whether every failed command
/// did: redis-rs gives a pipeline's error a code only for the codes it knows by name.
fn says_not_now(e: &RedisError) -> bool {
    match e.clone().into_server_errors() {
        Some(failed) if !failed.is_empty() => failed
            .iter()
            .all(|(_, s)| TRANSIENT_CODES.contains(&s.code())),
        _ => e.code().is_some_and(|c| TRANSIENT_CODES.contains(&c)),
    }
}

/// Converts a redis-rs error at the boundary: connection trouble and the server's transient
/// refusals ([`TRANSIENT_CODES`]) are `Unavailable` (retryable), anything else the server said
/// is `Backend`.
pub(crate) fn redis_error(backend: &'static str, node: &str, e: &RedisError, op: &str) -> Error {
    let kind = if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
        || says_not_now(e)
    {
        ErrorKind::Unavailable
    } else {
        ErrorKind::Backend
    };
    // redis-rs errors name the failing command and server message, never the password.
    Error::new(kind, backend, format!("{op} on {node}: {e}"))
}
