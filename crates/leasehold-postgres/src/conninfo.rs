//! Connection strings: URLs and libpq `key=value` strings, split into what tokio-postgres reads
//! and leasehold's own parameters.

use leasehold_core::{Error, ErrorKind};

use crate::NAME;

/// Parameters of a connection string that leasehold reads itself (and removes before the rest
/// goes to the PostgreSQL driver).
pub(crate) const OWN_PARAMS: &[&str] = &[
    "prefix",
    "fence_schema",
    "fence_sequence",
    "health_interval_ms",
    "health_timeout_ms",
    "max_sessions",
    "max_idle_sessions",
    leasehold_core::RELEASES_IN_FLIGHT_OPTION,
    "idle_timeout_ms",
    "sslmode",
    "sslrootcert",
    "advisory_keys",
    leasehold_core::transport::ALLOW_PLAINTEXT_PASSWORD,
];

pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidConfig, NAME, msg)
}

/// Whether the connection string passed on to tokio-postgres sets parameter `key` (as a URL
/// query parameter or a key=value pair).
pub(crate) fn params_given(s: &str, key: &str) -> bool {
    let query = s.split_once('?').map_or(s, |(_, q)| q);
    query
        .split(['&', ' '])
        .any(|p| p.split_once('=').is_some_and(|(k, _)| k.trim() == key))
}

/// Splits a URL into (URL without leasehold's parameters, leasehold's parameters).
pub(crate) fn split_url(s: &str) -> Result<(String, Vec<(String, String)>), Error> {
    let (base, query) = match s.split_once('?') {
        Some((b, q)) => (b, q),
        None => (s, ""),
    };
    let query = query.split_once('#').map_or(query, |(q, _)| q);
    let mut kept = Vec::new();
    let mut own = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let key = percent_decode(k)?;
        if OWN_PARAMS.contains(&key.as_str()) {
            own.push((key, percent_decode(v)?));
        } else {
            kept.push(pair.to_owned());
        }
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, own))
}

fn percent_decode(s: &str) -> Result<String, Error> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(Into::into)
        .map_err(|_| invalid("a URL parameter is not UTF-8"))
}

/// Splits a libpq key=value string into (the string without leasehold's parameters,
/// leasehold's parameters).
pub(crate) fn split_key_values(s: &str) -> Result<(String, Vec<(String, String)>), Error> {
    let mut kept = Vec::new();
    let mut own = Vec::new();
    for (key, value) in parse_key_values(s)? {
        if OWN_PARAMS.contains(&key.as_str()) {
            own.push((key, value));
        } else {
            kept.push(format!(
                "{key}='{}'",
                value.replace('\\', "\\\\").replace('\'', "\\'")
            ));
        }
    }
    Ok((kept.join(" "), own))
}

/// Parses libpq's `key = value` syntax (values bare or single-quoted with `\` escapes).
fn parse_key_values(s: &str) -> Result<Vec<(String, String)>, Error> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.peek().is_none() {
            return Ok(out);
        }
        let mut key = String::new();
        while let Some(c) = chars.next_if(|c| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            // The text is not quoted: it may be a password written without its key (or a
            // URL of another scheme, `user:password@host`).
            return Err(invalid(format!(
                "invalid connection string: expected `=` after key number {}",
                out.len() + 1
            )));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            loop {
                match chars.next() {
                    Some('\\') => match chars.next() {
                        Some(c) => value.push(c),
                        None => {
                            return Err(invalid("invalid connection string: unterminated quote"));
                        }
                    },
                    Some('\'') => break,
                    Some(c) => value.push(c),
                    None => return Err(invalid("invalid connection string: unterminated quote")),
                }
            }
        } else {
            while let Some(c) = chars.next_if(|c| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some(e) = chars.next() {
                        value.push(e);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        out.push((key, value));
    }
}
