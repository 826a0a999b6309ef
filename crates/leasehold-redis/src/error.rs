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

/// Server error codes that say the client is not allowed: an ACL refusing a command, a key or
/// a channel (`NOPERM`), or missing or wrong credentials (`NOAUTH`, `WRONGPASS`). Retrying does
/// not help; the configuration (the user's ACL, the password) must change.
const REFUSED_CODES: [&str; 3] = ["NOPERM", "NOAUTH", "WRONGPASS"];

/// Whether the server answered one of `codes`; for a pipeline (a pipelined acquire fails as a
/// whole, its error carrying each failed command's), whether every failed command did:
/// redis-rs gives a pipeline's error a code only for the codes it knows by name.
fn answered(e: &RedisError, codes: &[&str]) -> bool {
    match e.clone().into_server_errors() {
        Some(failed) if !failed.is_empty() => failed.iter().all(|(_, s)| codes.contains(&s.code())),
        _ => e.code().is_some_and(|c| codes.contains(&c)),
    }
}

/// Converts a redis-rs error at the boundary: refusals of the user ([`REFUSED_CODES`], a
/// password refused at connect) are `InvalidConfig`, connection trouble and the server's
/// transient refusals ([`TRANSIENT_CODES`]) `Unavailable` (retryable), anything else the
/// server said is `Backend`.
pub(crate) fn redis_error(backend: &'static str, node: &str, e: &RedisError, op: &str) -> Error {
    // Before the transient faults: redis-rs counts a refused password as a reason to reconnect.
    let kind = if e.kind() == redis::ErrorKind::AuthenticationFailed || answered(e, &REFUSED_CODES)
    {
        ErrorKind::InvalidConfig
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
        || answered(e, &TRANSIENT_CODES)
    {
        ErrorKind::Unavailable
    } else {
        ErrorKind::Backend
    };
    // redis-rs errors name the failing command and server message, never the password.
    Error::new(kind, backend, format!("{op} on {node}: {e}"))
}
