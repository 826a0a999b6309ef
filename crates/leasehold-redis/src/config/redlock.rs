//! [`RedlockConfig`]: the nodes of a Redlock and its options.

use std::fmt;
use std::time::Duration;

use leasehold_core::{Drift, Error, RELEASES_IN_FLIGHT, ReleaseGate, redact};

use super::{REDLOCK, Server, invalid, plaintext_allowed, read_ca, split_hosts};
use crate::keys::{DEFAULT_PREFIX, check_prefix};
use crate::options::{
    CA, CONNECT_TIMEOUT_MS, MIN_VALIDITY_MS, NODE_TIMEOUT_MS, PREFIX, REDLOCK_OPTIONS,
    RELEASES_IN_FLIGHT as RELEASES_OPTION, UrlOptions,
};

/// Configuration of [`RedlockBackend`](crate::RedlockBackend).
#[derive(Clone)]
pub struct RedlockConfig {
    pub(crate) servers: Vec<Server>,
    pub(crate) tls_ca: Option<Vec<u8>>,
    pub(crate) prefix: String,
    pub(crate) node_timeout: Option<Duration>,
    pub(crate) connect_timeout: Duration,
    pub(crate) min_validity: Duration,
    pub(crate) drift: Drift,
    pub(crate) releases_in_flight: usize,
}

impl fmt::Debug for RedlockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<&str> = self.servers.iter().map(|s| s.redacted.as_str()).collect();
        f.debug_struct("RedlockConfig")
            .field("nodes", &urls)
            .field("prefix", &self.prefix)
            .field("node_timeout", &self.node_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("min_validity", &self.min_validity)
            .field("drift", &self.drift)
            .field("releases_in_flight", &self.releases_in_flight)
            .finish()
    }
}

impl RedlockConfig {
    /// From one `redis://` URL per node. Needs at least 3 distinct nodes.
    pub fn from_urls<I, S>(urls: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::from_urls_checked(urls, true)
    }

    /// [`from_urls`](Self::from_urls), refusing a password in clear to a remote node unless
    /// `allow_plaintext` (warning otherwise).
    fn from_urls_checked<I, S>(urls: I, allow_plaintext: bool) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let servers = urls
            .into_iter()
            .map(|u| Server::parse(REDLOCK, u.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if servers.len() < 3 {
            return Err(invalid(
                REDLOCK,
                format!(
                    "Redlock needs at least 3 independent nodes, got {}: with fewer, one node's \
                     failure or restart decides the lock",
                    servers.len()
                ),
            ));
        }
        for server in &servers {
            server.check_plaintext(REDLOCK, allow_plaintext)?;
        }
        for (i, a) in servers.iter().enumerate() {
            if let Some(b) = servers[..i].iter().find(|b| {
                b.name == a.name && b.info.redis_settings().db() == a.info.redis_settings().db()
            }) {
                return Err(invalid(
                    REDLOCK,
                    format!(
                        "node {} is listed twice ({} and {}): a quorum must be of distinct nodes",
                        a.name, b.redacted, a.redacted
                    ),
                ));
            }
        }
        Ok(Self {
            servers,
            tls_ca: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            node_timeout: None,
            connect_timeout: Duration::from_secs(1),
            min_validity: Duration::from_millis(1),
            drift: Drift::default(),
            releases_in_flight: RELEASES_IN_FLIGHT,
        })
    }

    /// From `redlock://[user:password@]host:port,host:port,…[/db]`: the same credentials and
    /// database on every node. leasehold's own query options:
    ///
    /// | option | sets |
    /// |---|---|
    /// | `prefix=P` | [`with_prefix`](Self::with_prefix) (a configured key prefix wins) |
    /// | `ca=PATH` | [`with_tls_ca_file`](Self::with_tls_ca_file) (PEM; `rediss://` nodes) |
    /// | `node_timeout_ms=N` | [`with_node_timeout`](Self::with_node_timeout) |
    /// | `connect_timeout_ms=N` | [`with_connect_timeout`](Self::with_connect_timeout) |
    /// | `min_validity_ms=N` | [`with_min_validity`](Self::with_min_validity) |
    /// | `releases_in_flight=N` | [`with_releases_in_flight`](Self::with_releases_in_flight) |
    /// | `allow_plaintext_password=false` | refuse a password sent without TLS to a node that is not loopback (by default: a warning, per node) |
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let (url, o) = UrlOptions::take(REDLOCK, url, REDLOCK_OPTIONS)?;
        let allow = plaintext_allowed(REDLOCK, &o)?;
        let mut config = Self::from_urls_checked(split_hosts(REDLOCK, &url, "redlock://")?, allow)?;
        if let Some(prefix) = o.get(PREFIX) {
            config = config.with_prefix(prefix)?;
        }
        if let Some(path) = o.get(CA) {
            config = config.with_tls_ca_file(path)?;
        }
        if let Some(t) = o.millis(NODE_TIMEOUT_MS)? {
            config = config.with_node_timeout(t);
        }
        if let Some(t) = o.millis(CONNECT_TIMEOUT_MS)? {
            config = config.with_connect_timeout(t);
        }
        if let Some(t) = o.millis(MIN_VALIDITY_MS)? {
            config = config.with_min_validity(t);
        }
        if let Some(n) = o.get(RELEASES_OPTION) {
            config.releases_in_flight = ReleaseGate::parse_size(REDLOCK, n)?;
        }
        Ok(config)
    }

    /// From a configuration's list of nodes: each a `redis://` URL (see
    /// [`from_urls`](Self::from_urls)).
    pub(crate) fn from_nodes(nodes: &[String]) -> Result<Self, Error> {
        if nodes.is_empty() {
            return Err(invalid(REDLOCK, "no Redlock node given"));
        }
        if let Some(other) = nodes.iter().find(|u| !u.starts_with("redis://")) {
            return Err(invalid(
                REDLOCK,
                format!(
                    "each Redlock node is a redis:// URL, got {:?}",
                    redact(other)
                ),
            ));
        }
        Self::from_urls(nodes)
    }

    /// Sets the key prefix (no braces: they would move the hash tag).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Result<Self, Error> {
        self.prefix = check_prefix(REDLOCK, prefix.into())?;
        Ok(self)
    }

    /// Trusts the CA certificate(s) in this PEM file for `rediss://` nodes.
    pub fn with_tls_ca_file(mut self, path: impl AsRef<std::path::Path>) -> Result<Self, Error> {
        self.tls_ca = Some(read_ca(REDLOCK, path.as_ref())?);
        Ok(self)
    }

    /// Bounds every request to one node. Default: `ttl / 200`, between 5 ms and 50 ms (the
    /// Redlock text suggests 5–50 ms for a 10 s TTL); never more than the validity left. A
    /// batch of renewals (thousands of keys per node) waits for each node at least `ttl / 10`,
    /// a release at least 1 s: they come in bursts, and waiting costs them only time.
    ///
    /// Nodes connect on first use. The first request to a node waits for that connect (within
    /// the [connect timeout](Self::with_connect_timeout)) before its timer starts, so a new
    /// backend's first acquisition is not refused for connecting; the time it takes still
    /// counts against the grant's validity. Once a node's first connect has failed, its
    /// requests' own timers cover connecting again.
    pub fn with_node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }

    /// Sets the connect timeout of each node (default 1 s).
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// An acquisition succeeds only if at least this much validity is left after subtracting
    /// the elapsed time and the drift margin (default 1 ms).
    pub fn with_min_validity(mut self, min: Duration) -> Self {
        self.min_validity = min;
        self
    }

    /// Bounds the release calls in flight at once (default [`RELEASES_IN_FLIGHT`], at least
    /// 1; a release sends one request per node): the others wait their turn (see
    /// [`ReleaseGate`]).
    pub fn with_releases_in_flight(mut self, n: usize) -> Result<Self, Error> {
        self.releases_in_flight = ReleaseGate::check_size(REDLOCK, n)?;
        Ok(self)
    }

    /// The drift margin used for the validity decision (default `ttl × 0.01 + 2 ms`).
    pub fn with_drift(mut self, drift: Drift) -> Self {
        self.drift = drift;
        self
    }

    /// Number of nodes.
    pub fn nodes(&self) -> usize {
        self.servers.len()
    }

    /// The majority: `N / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.servers.len() / 2 + 1
    }
}
