//! The one mapping of PostgreSQL errors to leasehold's: what a caller can match on and
//! whether retrying can help.

use leasehold_core::{Error, ErrorKind};
use tokio_postgres::error::SqlState;

use crate::NAME;
use crate::config::PostgresConfig;

/// A failed connect; with TLS the message says which `sslmode` was in force, since a
/// certificate that fails verification shows up as an I/O error of the handshake.
/// tokio-postgres' own message omits the cause (e.g. the rustls verdict), so its source chain
/// is appended (none of it carries a password).
pub(crate) fn connect_error(cfg: &PostgresConfig, e: tokio_postgres::Error) -> Error {
    let mut what = if cfg.tls.is_some() {
        format!("connect (sslmode={})", cfg.ssl_mode())
    } else {
        "connect".to_owned()
    };
    let mut causes = String::new();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        causes.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    let kind = classify(&e);
    what.push_str(&format!(": {e}{causes}"));
    Error::new(kind, NAME, what).with_source(e)
}

/// Whether the error is PostgreSQL's "lock timeout" (SQLSTATE 55P03, lock_not_available).
pub(crate) fn is_lock_timeout(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE)
}

/// Converts a driver error into the public error, classifying it; never includes a password
/// (tokio-postgres' messages carry none).
pub(crate) fn pg_error(what: &str, e: tokio_postgres::Error) -> Error {
    let kind = classify(&e);
    Error::new(kind, NAME, format!("{what}: {e}")).with_source(e)
}

fn classify(e: &tokio_postgres::Error) -> ErrorKind {
    if e.is_closed() {
        return ErrorKind::Unavailable;
    }
    classify_code(e.code().map(SqlState::code))
}

/// The kind for a SQLSTATE (`None`: no server error, e.g. I/O or a timeout).
fn classify_code(code: Option<&str>) -> ErrorKind {
    let Some(code) = code else {
        // I/O, connect, timeouts, protocol: the server is unreachable or went away.
        return ErrorKind::Unavailable;
    };
    match code {
        // Connection exceptions; insufficient resources: too many connections (53300) and
        // `out of shared memory` (53200: the server's shared lock table is full, which fails
        // every new lock on the server until locks are released); operator intervention
        // (shutdown, starting up; a statement cancelled by a `statement_timeout` or by an
        // operator, 57014); system errors.
        _ if code.starts_with("08")
            || code.starts_with("53")
            || code.starts_with("57P")
            || code == "57014"
            || code.starts_with("58") =>
        {
            ErrorKind::Unavailable
        }
        // Authentication, unknown database, missing privilege.
        _ if code.starts_with("28") || code == "3D000" || code == "42501" => {
            ErrorKind::InvalidConfig
        }
        _ => ErrorKind::Backend,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_exhaustion_is_unavailable() {
        for (state, kind) in [
            (SqlState::OUT_OF_MEMORY, ErrorKind::Unavailable), // 53200: shared lock table full
            (SqlState::TOO_MANY_CONNECTIONS, ErrorKind::Unavailable),
            (SqlState::ADMIN_SHUTDOWN, ErrorKind::Unavailable),
            (SqlState::QUERY_CANCELED, ErrorKind::Unavailable), // 57014: statement_timeout
            (SqlState::INVALID_PASSWORD, ErrorKind::InvalidConfig),
            (SqlState::LOCK_NOT_AVAILABLE, ErrorKind::Backend),
        ] {
            assert_eq!(classify_code(Some(state.code())), kind, "{}", state.code());
        }
        assert_eq!(SqlState::OUT_OF_MEMORY.code(), "53200");
        assert_eq!(classify_code(None), ErrorKind::Unavailable);
    }
}
