//! Passwords in clear: the one rule every driver applies before it sends a password over a
//! connection without TLS.
//!
//! A password sent without TLS to a **loopback** address never leaves the host; sent to any
//! other address it crosses a network in clear. [`is_loopback_host`] tells the two apart, and
//! [`check_plaintext_password`] is what a driver calls when it is about to send a password
//! without TLS: a `warn!` (target `leasehold.plaintext`) by default, or an
//! [`ErrorKind::InvalidConfig`] error when the configuration says
//! `allow_plaintext_password=false`.

use std::net::IpAddr;

use crate::error::{Error, ErrorKind};

/// The option (URL parameter and configuration setting of every network driver) that turns
/// the warning into a refusal: `allow_plaintext_password=false`.
pub const ALLOW_PLAINTEXT_PASSWORD: &str = "allow_plaintext_password";

/// Whether `host` names this host's loopback interface, so that what is sent to it never
/// crosses a network: an IP literal in `127.0.0.0/8` or `::1` (also IPv4-mapped,
/// `::ffff:127.0.0.1`), the name `localhost` (any case, with or without a final dot), or a
/// local socket path (starting with `/` or `@`).
///
/// `host` may carry a port (`127.0.0.1:6379`, `[::1]:2379`) and IPv6 brackets. Every other name
/// is **not** loopback, whatever it resolves to: a name is looked up later, by someone else,
/// and may resolve elsewhere then.
///
/// ```
/// use leasehold_core::transport::is_loopback_host;
///
/// assert!(is_loopback_host("127.0.0.1"));
/// assert!(is_loopback_host("127.3.2.1:5432"));
/// assert!(is_loopback_host("[::1]:2379"));
/// assert!(is_loopback_host("LocalHost"));
/// assert!(!is_loopback_host("10.0.0.1"));
/// assert!(!is_loopback_host("db.example.com"));
/// assert!(!is_loopback_host("localhost.example.com"));
/// ```
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim();
    if host.starts_with('/') || host.starts_with('@') {
        return true;
    }
    let bare = if let Some(rest) = host.strip_prefix('[') {
        match rest.split_once(']') {
            Some((inside, _port)) => inside,
            None => return false,
        }
    } else if host.parse::<IpAddr>().is_ok() {
        host
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => {
                name
            }
            _ => host,
        }
    };
    match bare.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => ip.is_loopback(),
        Ok(IpAddr::V6(ip)) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        Err(_) => {
            let name = bare.strip_suffix('.').unwrap_or(bare);
            name.eq_ignore_ascii_case("localhost")
        }
    }
}

/// What a driver calls when it is about to send a password without TLS to `host` (`what` says
/// how, for the message: `"etcd user:password over http://"`). Nothing happens for a loopback
/// host ([`is_loopback_host`]); otherwise a `warn!` (target `leasehold.plaintext`), or, when
/// `allow` is false (`allow_plaintext_password=false`), an [`ErrorKind::InvalidConfig`] error
/// of `backend`. Neither quotes the password.
pub fn check_plaintext_password(
    backend: &'static str,
    host: &str,
    what: &str,
    allow: bool,
) -> Result<(), Error> {
    if is_loopback_host(host) {
        return Ok(());
    }
    if !allow {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            backend,
            format!(
                "refusing to send a password in clear to {host} ({what}; \
                 {ALLOW_PLAINTEXT_PASSWORD}=false): use TLS"
            ),
        ));
    }
    tracing::warn!(
        target: "leasehold.plaintext",
        backend,
        host,
        "a password is about to cross the network to {host} in clear ({what}): use TLS, or set \
         {ALLOW_PLAINTEXT_PASSWORD}=false to refuse this"
    );
    Ok(())
}

/// Parses the value of [`ALLOW_PLAINTEXT_PASSWORD`] (`true`/`false`, also `1`/`0`, `yes`/`no`,
/// `on`/`off`), as an [`ErrorKind::InvalidConfig`] error of `backend` otherwise.
pub fn parse_allow_plaintext(backend: &'static str, value: &str) -> Result<bool, Error> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(Error::new(
            ErrorKind::InvalidConfig,
            backend,
            format!("{ALLOW_PLAINTEXT_PASSWORD} must be true or false"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for host in [
            "127.0.0.1",
            "127.255.0.9",
            "127.0.0.1:6379",
            "::1",
            "[::1]",
            "[::1]:2379",
            "::ffff:127.0.0.1",
            "localhost",
            "LOCALHOST:5432",
            "localhost.",
            "/var/run/postgresql",
            "@abstract",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "10.0.0.1",
            "128.0.0.1",
            "0.0.0.0",
            "::",
            "[fe80::1]:5",
            "::ffff:10.0.0.1",
            "db",
            "db:5432",
            "localhost.example.com",
            "mylocalhost",
            "",
            "[::1",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn refusal_names_the_switch() {
        assert!(check_plaintext_password("x", "127.0.0.1", "test", false).is_ok());
        assert!(check_plaintext_password("x", "10.1.1.1", "test", true).is_ok());
        let e = check_plaintext_password("x", "10.1.1.1", "test", false).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        assert!(e.to_string().contains(ALLOW_PLAINTEXT_PASSWORD), "{e}");
        assert_eq!(parse_allow_plaintext("x", "FALSE").ok(), Some(false));
        assert!(parse_allow_plaintext("x", "maybe").is_err());
    }
}
