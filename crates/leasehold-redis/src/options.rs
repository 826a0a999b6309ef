//! leasehold's own options in a Redis URL's query string (`?fair_queue_ms=500&ca=/etc/ca.pem`),
//! taken out before redis-rs reads the URL, so that every option of [`RedisConfig`] and
//! [`RedlockConfig`] is reachable from a URL, and so from `LockConfig` and the CLI.
//!
//! [`RedisConfig`]: crate::RedisConfig
//! [`RedlockConfig`]: crate::RedlockConfig

use std::time::Duration;

use leasehold_core::{Error, ErrorKind};
use percent_encoding::percent_decode_str;

/// Options of `redis://`, `rediss://`, `redis+unix://`, `unix://` and `redis-cluster://` URLs.
pub(crate) const REDIS_OPTIONS: &[&str] = &[
    PREFIX,
    CA,
    FAIR_QUEUE_MS,
    CONNECT_TIMEOUT_MS,
    RESPONSE_TIMEOUT_MS,
    WAIT_INITIAL_MS,
    WAIT_MAX_MS,
    ALLOW_PLAINTEXT_PASSWORD,
    FENCE_TTL_MS,
    REPLICA_SYNC,
    REPLICA_SYNC_TIMEOUT_MS,
    RELEASES_IN_FLIGHT,
];

/// Options that only `redis+sentinel://` and `rediss+sentinel://` URLs take, besides
/// [`REDIS_OPTIONS`]: the sentinels' own login.
pub(crate) const SENTINEL_ONLY_OPTIONS: &[&str] = &[SENTINEL_USER, SENTINEL_PASSWORD];

/// Options of `redlock://` URLs.
pub(crate) const REDLOCK_OPTIONS: &[&str] = &[
    PREFIX,
    CA,
    NODE_TIMEOUT_MS,
    CONNECT_TIMEOUT_MS,
    MIN_VALIDITY_MS,
    ALLOW_PLAINTEXT_PASSWORD,
    RELEASES_IN_FLIGHT,
];

pub(crate) const PREFIX: &str = "prefix";
pub(crate) const CA: &str = "ca";
pub(crate) const FAIR_QUEUE_MS: &str = "fair_queue_ms";
pub(crate) const CONNECT_TIMEOUT_MS: &str = "connect_timeout_ms";
pub(crate) const RESPONSE_TIMEOUT_MS: &str = "response_timeout_ms";
pub(crate) const WAIT_INITIAL_MS: &str = "wait_initial_ms";
pub(crate) const WAIT_MAX_MS: &str = "wait_max_ms";
pub(crate) const NODE_TIMEOUT_MS: &str = "node_timeout_ms";
pub(crate) const MIN_VALIDITY_MS: &str = "min_validity_ms";
pub(crate) const ALLOW_PLAINTEXT_PASSWORD: &str =
    leasehold_core::transport::ALLOW_PLAINTEXT_PASSWORD;
pub(crate) const FENCE_TTL_MS: &str = "fence_ttl_ms";
pub(crate) const REPLICA_SYNC: &str = "replica_sync";
pub(crate) const REPLICA_SYNC_TIMEOUT_MS: &str = "replica_sync_timeout_ms";
pub(crate) const RELEASES_IN_FLIGHT: &str = leasehold_core::RELEASES_IN_FLIGHT_OPTION;
pub(crate) const SENTINEL_USER: &str = "sentinel_user";
pub(crate) const SENTINEL_PASSWORD: &str = "sentinel_password";

/// The options taken out of one URL, percent-decoded.
pub(crate) struct UrlOptions {
    backend: &'static str,
    pairs: Vec<(&'static str, String)>,
}

impl UrlOptions {
    /// Takes the options named in `names` out of `url`'s query: the URL without them (for
    /// redis-rs, which reads the rest: `protocol`, `db`, …), and the options.
    pub(crate) fn take(
        backend: &'static str,
        url: &str,
        names: &[&'static str],
    ) -> Result<(String, Self), Error> {
        let mut options = Self {
            backend,
            pairs: Vec::new(),
        };
        let Some((base, query)) = url.split_once('?') else {
            return Ok((url.to_owned(), options));
        };
        let mut kept = Vec::new();
        for pair in query.split('&') {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match names.iter().find(|n| **n == k) {
                Some(name) => {
                    let value = percent_decode_str(v)
                        .decode_utf8()
                        .map_err(|_| invalid(backend, format!("`{name}`: not UTF-8")))?;
                    options.pairs.push((name, value.into_owned()));
                }
                None => kept.push(pair),
            }
        }
        let url = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        Ok((url, options))
    }

    /// The value of `name`, if given (the last one wins).
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// `name` as a whole number of milliseconds, if given.
    pub(crate) fn millis(&self, name: &str) -> Result<Option<Duration>, Error> {
        self.get(name)
            .map(|v| {
                v.parse::<u64>().map(Duration::from_millis).map_err(|_| {
                    invalid(
                        self.backend,
                        format!("`{name}={v}` is not a whole number of milliseconds"),
                    )
                })
            })
            .transpose()
    }
}

fn invalid(backend: &'static str, msg: String) -> Error {
    Error::new(ErrorKind::InvalidConfig, backend, msg)
}
