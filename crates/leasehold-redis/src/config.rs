//! Configuration: URLs, prefixes, timeouts. Debug output never shows a password.

use std::fmt;
use std::time::Duration;

use leasehold_core::{Backoff, Error, ErrorKind, RELEASES_IN_FLIGHT, ReleaseGate, redact};
use redis::{ConnectionInfo, IntoConnectionInfo, ProtocolVersion};

use crate::keys::{DEFAULT_PREFIX, check_prefix};
use crate::options::{
    ALLOW_PLAINTEXT_PASSWORD, CA, CONNECT_TIMEOUT_MS, FAIR_QUEUE_MS, FENCE_TTL_MS, PREFIX,
    REDIS_OPTIONS, RELEASES_IN_FLIGHT as RELEASES_OPTION, REPLICA_SYNC, REPLICA_SYNC_TIMEOUT_MS,
    RESPONSE_TIMEOUT_MS, SENTINEL_ONLY_OPTIONS, SENTINEL_PASSWORD, SENTINEL_USER, UrlOptions,
    WAIT_INITIAL_MS, WAIT_MAX_MS,
};
use crate::sentinel::{SENTINEL_SCHEMES, SentinelTarget};

mod redlock;

pub use self::redlock::RedlockConfig;

/// Every URL scheme of this driver: [`RedisBackend`](crate::RedisBackend) on one server
/// (`redis`, `rediss` for TLS, `redis+unix`, `unix`) or on a Redis Cluster given its seed nodes
/// (`redis-cluster://[user:password@]host:port,host:port,…`, `rediss-cluster://…` over TLS) or
/// on the master that Redis Sentinel names (`redis+sentinel://`, `rediss+sentinel://`; see the
/// crate docs), and [`REDLOCK_SCHEMES`].
pub const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+unix",
    "unix",
    "redis-cluster",
    "rediss-cluster",
    "redis+sentinel",
    "rediss+sentinel",
    "redlock",
];

/// The URL scheme of [`RedlockBackend`](crate::RedlockBackend), among [`SCHEMES`]:
/// `redlock://[user:password@]host:port,host:port,…[/db]`.
pub const REDLOCK_SCHEMES: &[&str] = &["redlock"];

/// The name of [`RedisBackend`](crate::RedisBackend), as errors and leases report it.
pub(crate) const REDIS: &str = "redis";

/// The name of [`RedlockBackend`](crate::RedlockBackend), as errors and leases report it.
pub(crate) const REDLOCK: &str = "redlock";

/// Makes rustls use the *ring* provider unless the process already chose one.
pub(crate) fn install_crypto_provider() {
    // An error only means a provider is installed already: that one is used.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Reads a PEM CA file for `rediss://` connections.
/// The `allow_plaintext_password` option (default `true`: warn only).
fn plaintext_allowed(backend: &'static str, o: &UrlOptions) -> Result<bool, Error> {
    o.get(ALLOW_PLAINTEXT_PASSWORD).map_or(Ok(true), |v| {
        leasehold_core::transport::parse_allow_plaintext(backend, v)
    })
}

fn read_ca(backend: &'static str, path: &std::path::Path) -> Result<Vec<u8>, Error> {
    leasehold_core::transport::read_tls_file(path).map_err(|e| {
        invalid(
            backend,
            // Through `redact`: the path is a URL option's value, where the rest of the
            // query can hide (`?ca=/x?password=…`).
            format!(
                "cannot read the TLS CA file {}: {e}",
                redact(&path.display().to_string())
            ),
        )
    })
}

pub(crate) fn invalid(backend: &'static str, msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidConfig, backend, msg)
}

/// One Redis server, parsed and redacted.
#[derive(Clone)]
pub(crate) struct Server {
    pub(crate) info: ConnectionInfo,
    /// Address only (`host:port` or socket path).
    pub(crate) name: String,
    /// The URL with its password replaced.
    pub(crate) redacted: String,
}

impl Server {
    pub(crate) fn parse(backend: &'static str, url: &str) -> Result<Self, Error> {
        leasehold_core::redaction::refuse_unencoded_userinfo(backend, url)?;
        let redacted = redact(url);
        let info = url.into_connection_info().map_err(|e| {
            invalid(
                backend,
                format!("{redacted} is not a valid Redis URL ({})", e.category()),
            )
        })?;
        Ok(Self {
            name: info.addr().to_string(),
            info,
            redacted,
        })
    }

    /// Before a password goes to this server without TLS: warns, or refuses unless `allow`,
    /// when the server is not on loopback (see [`leasehold_core::transport`]). Unix sockets
    /// and TLS connections pass.
    pub(crate) fn check_plaintext(&self, backend: &'static str, allow: bool) -> Result<(), Error> {
        let settings = self.info.redis_settings();
        match self.info.addr() {
            redis::ConnectionAddr::Tcp(host, _) if settings.password().is_some() => {
                leasehold_core::transport::check_plaintext_password(
                    backend,
                    host,
                    "a Redis password over redis:// without TLS",
                    allow,
                )
            }
            _ => Ok(()),
        }
    }

    /// Whether the URL asks for TLS (`rediss://`).
    pub(crate) fn is_tls(&self) -> bool {
        matches!(self.info.addr(), redis::ConnectionAddr::TcpTls { .. })
    }

    /// A redis-rs client for this server, trusting `ca` (PEM) instead of the system roots when
    /// given.
    pub(crate) fn client(
        &self,
        backend: &'static str,
        info: ConnectionInfo,
        ca: Option<&[u8]>,
    ) -> Result<redis::Client, Error> {
        let built = match ca {
            Some(ca) if self.is_tls() => {
                install_crypto_provider();
                redis::Client::build_with_tls(
                    info,
                    redis::TlsCertificates {
                        client_tls: None,
                        root_cert: Some(ca.to_vec()),
                    },
                )
            }
            _ => {
                if self.is_tls() {
                    install_crypto_provider();
                }
                redis::Client::open(info)
            }
        };
        built.map_err(|e| invalid(backend, format!("{}: {}", self.redacted, e.category())))
    }

    /// The connection info with RESP3 (needed for wake-up pushes on the shared connection).
    pub(crate) fn resp3(&self) -> ConnectionInfo {
        let settings = self
            .info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        self.info.clone().set_redis_settings(settings)
    }
}

/// Where a [`RedisBackend`](crate::RedisBackend) connects.
#[derive(Clone)]
pub(crate) enum Deployment {
    /// One server.
    Server(Box<Server>),
    /// A Redis Cluster, by its seed nodes.
    Cluster(Vec<Server>),
    /// The master that Redis Sentinel names.
    Sentinel(Box<SentinelTarget>),
}

impl Deployment {
    /// [`Server::check_plaintext`] of every server.
    fn check_plaintext(&self, allow: bool) -> Result<(), Error> {
        match self {
            Self::Server(s) => s.check_plaintext(REDIS, allow),
            Self::Cluster(seeds) => seeds
                .iter()
                .try_for_each(|s| s.check_plaintext(REDIS, allow)),
            Self::Sentinel(t) => t.check_plaintext(REDIS, allow),
        }
    }

    fn redacted(&self) -> String {
        match self {
            Self::Server(s) => s.redacted.clone(),
            Self::Cluster(seeds) => {
                let urls: Vec<&str> = seeds.iter().map(|s| s.redacted.as_str()).collect();
                format!("cluster [{}]", urls.join(", "))
            }
            Self::Sentinel(t) => t.redacted.clone(),
        }
    }

    /// The address(es), for messages.
    pub(crate) fn name(&self) -> String {
        match self {
            Self::Server(s) => s.name.clone(),
            Self::Cluster(seeds) => {
                let names: Vec<&str> = seeds.iter().map(|s| s.name.as_str()).collect();
                format!("cluster {}", names.join(","))
            }
            Self::Sentinel(t) => t.name(),
        }
    }
}

/// Splits `scheme://[userinfo@]h1,h2,…[/tail]` into one `redis://[userinfo@]hN[/tail]` per host.
fn split_hosts(backend: &'static str, url: &str, scheme: &str) -> Result<Vec<String>, Error> {
    let rest = url.strip_prefix(scheme).ok_or_else(|| {
        invalid(
            backend,
            format!("{}: expected a URL starting with {scheme}", redact(url)),
        )
    })?;
    // The seeds of `rediss-cluster://` speak TLS.
    let seed = scheme.strip_suffix("-cluster://").unwrap_or("redis");
    let hosts_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(hosts_end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let urls: Vec<String> = hosts
        .split(',')
        .filter(|h| !h.is_empty())
        .map(|h| format!("{seed}://{userinfo}{h}{tail}"))
        .collect();
    if urls.is_empty() {
        return Err(invalid(backend, format!("{}: no host given", redact(url))));
    }
    Ok(urls)
}

/// Configuration of [`RedisBackend`](crate::RedisBackend).
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) deployment: Deployment,
    pub(crate) tls_ca: Option<Vec<u8>>,
    pub(crate) fair: Option<Duration>,
    pub(crate) fence_ttl: Option<Duration>,
    pub(crate) prefix: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) wait_backoff: Backoff,
    /// Replicas that must have a grant before it counts, and how long to wait for them.
    pub(crate) replica_sync: Option<(usize, Duration)>,
    pub(crate) releases_in_flight: usize,
}

/// The default of [`RedisConfig::with_replica_sync`]'s timeout (URL option
/// `replica_sync_timeout_ms`).
pub const DEFAULT_REPLICA_SYNC_TIMEOUT: Duration = Duration::from_millis(200);

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.deployment.redacted())
            .field("tls_ca", &self.tls_ca.as_ref().map(|_| "<PEM>"))
            .field("fair_queue_grace", &self.fair)
            .field("fence_ttl", &self.fence_ttl)
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("wait_backoff", &self.wait_backoff)
            .field("replica_sync", &self.replica_sync)
            .field("releases_in_flight", &self.releases_in_flight)
            .finish()
    }
}

impl RedisConfig {
    /// From a `redis://[user:password@]host[:port][/db]` (or `redis+unix:///path`) URL, or a
    /// `redis-cluster://[user:password@]host:port,host:port,…` URL of a Redis Cluster's seed
    /// nodes (`rediss-cluster://…` over TLS), with the default prefix `leasehold:`, a 1 s connect timeout and a 1 s response
    /// timeout.
    ///
    /// leasehold's own query options (the other query options are redis-rs's):
    ///
    /// | option | sets |
    /// |---|---|
    /// | `prefix=P` | [`with_prefix`](Self::with_prefix) (a configured key prefix wins) |
    /// | `ca=PATH` | [`with_tls_ca_file`](Self::with_tls_ca_file) (PEM; `rediss://`) |
    /// | `fair_queue_ms=GRACE` | [fair mode](Self::with_fair_queue), grace in ms (at least 100) |
    /// | `connect_timeout_ms=N`, `response_timeout_ms=N` | [`with_timeouts`](Self::with_timeouts) |
    /// | `wait_initial_ms=N`, `wait_max_ms=N` | [`with_wait_backoff`](Self::with_wait_backoff) |
    /// | `allow_plaintext_password=false` | refuse a password sent without TLS (`redis://`) to a server that is not loopback; by default that only logs a warning (see [`leasehold_core::transport`]) |
    /// | `fence_ttl_ms=N` | [`with_fence_ttl`](Self::with_fence_ttl) |
    /// | `releases_in_flight=N` | [`with_releases_in_flight`](Self::with_releases_in_flight) |
    ///
    /// `redis+sentinel://` and `rediss+sentinel://` URLs also take `sentinel_user=U` and
    /// `sentinel_password=P`, the sentinels' own login (see the crate docs).
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let sentinel = SENTINEL_SCHEMES
            .iter()
            .any(|s| url.strip_prefix(s).is_some_and(|r| r.starts_with("://")));
        let only: &[&str] = if sentinel { SENTINEL_ONLY_OPTIONS } else { &[] };
        let names: Vec<&str> = REDIS_OPTIONS.iter().chain(only).copied().collect();
        let (url, options) = UrlOptions::take(REDIS, url, &names)?;
        let url = url.as_str();
        let cluster = ["redis-cluster://", "rediss-cluster://"]
            .into_iter()
            .find(|s| url.starts_with(s));
        let deployment = if sentinel {
            Deployment::Sentinel(Box::new(SentinelTarget::parse(
                REDIS,
                url,
                options.get(SENTINEL_USER),
                options.get(SENTINEL_PASSWORD),
            )?))
        } else if let Some(scheme) = cluster {
            let seeds = split_hosts(REDIS, url, scheme)?
                .iter()
                .map(|u| Server::parse(REDIS, u))
                .collect::<Result<Vec<_>, _>>()?;
            Deployment::Cluster(seeds)
        } else {
            Deployment::Server(Box::new(Server::parse(REDIS, url)?))
        };
        deployment.check_plaintext(plaintext_allowed(REDIS, &options)?)?;
        Self::with_deployment(deployment).with_url_options(&options)
    }

    fn with_url_options(mut self, o: &UrlOptions) -> Result<Self, Error> {
        if let Some(prefix) = o.get(PREFIX) {
            self = self.with_prefix(prefix)?;
        }
        if let Some(path) = o.get(CA) {
            self = self.with_tls_ca_file(path)?;
        }
        if let Some(grace) = o.millis(FAIR_QUEUE_MS)? {
            self = self.with_fair_queue(grace)?;
        }
        if let Some(ttl) = o.millis(FENCE_TTL_MS)? {
            self = self.with_fence_ttl(ttl)?;
        }
        if let Some(n) = o.get(RELEASES_OPTION) {
            self.releases_in_flight = ReleaseGate::parse_size(REDIS, n)?;
        }
        let connect = o
            .millis(CONNECT_TIMEOUT_MS)?
            .unwrap_or(self.connect_timeout);
        let response = o
            .millis(RESPONSE_TIMEOUT_MS)?
            .unwrap_or(self.response_timeout);
        let backoff = Backoff {
            initial: o
                .millis(WAIT_INITIAL_MS)?
                .unwrap_or(self.wait_backoff.initial),
            max: o.millis(WAIT_MAX_MS)?.unwrap_or(self.wait_backoff.max),
        };
        if let Some(n) = o.get(REPLICA_SYNC) {
            let n = n.parse().map_err(|_| {
                invalid(
                    REDIS,
                    format!("`{REPLICA_SYNC}={n}` is not a number of replicas"),
                )
            })?;
            let timeout = o
                .millis(REPLICA_SYNC_TIMEOUT_MS)?
                .unwrap_or(DEFAULT_REPLICA_SYNC_TIMEOUT);
            self = self.with_replica_sync(n, timeout)?;
        }
        Ok(self
            .with_timeouts(connect, response)
            .with_wait_backoff(backoff))
    }

    /// Counts a grant only once `replicas` replicas have it (`WAIT replicas timeout` after each
    /// acquisition, on a connection of its own); when fewer acknowledge it within `timeout`,
    /// the grant is given back and the acquisition fails with a retryable error. Off by
    /// default: see the crate docs, "Redis Sentinel". Not for a Redis Cluster.
    pub fn with_replica_sync(mut self, replicas: usize, timeout: Duration) -> Result<Self, Error> {
        if replicas == 0 || timeout.is_zero() {
            return Err(invalid(
                REDIS,
                "replica sync needs at least one replica and a timeout above zero",
            ));
        }
        if matches!(self.deployment, Deployment::Cluster(_)) {
            return Err(invalid(
                REDIS,
                "replica sync is not supported on a Redis Cluster",
            ));
        }
        self.replica_sync = Some((replicas, timeout));
        Ok(self)
    }

    /// A Redis Cluster, from the `redis://` URLs of some of its nodes (seeds).
    pub fn cluster<I, S>(seeds: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let seeds = seeds
            .into_iter()
            .map(|u| Server::parse(REDIS, u.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if seeds.is_empty() {
            return Err(invalid(
                REDIS,
                "a Redis Cluster needs at least one seed node",
            ));
        }
        let deployment = Deployment::Cluster(seeds);
        deployment.check_plaintext(true)?;
        Ok(Self::with_deployment(deployment))
    }

    fn with_deployment(deployment: Deployment) -> Self {
        Self {
            deployment,
            tls_ca: None,
            fair: None,
            fence_ttl: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            wait_backoff: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_secs(1),
            },
            replica_sync: None,
            releases_in_flight: RELEASES_IN_FLIGHT,
        }
    }

    /// Sets the key prefix (no braces: they would move the hash tag).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Result<Self, Error> {
        self.prefix = check_prefix(REDIS, prefix.into())?;
        Ok(self)
    }

    /// Bounds the release calls in flight to the server at once (default
    /// [`RELEASES_IN_FLIGHT`], at least 1): the others wait their turn (see
    /// [`ReleaseGate`]). Permits and elections made from the backend share the bound.
    pub fn with_releases_in_flight(mut self, n: usize) -> Result<Self, Error> {
        self.releases_in_flight = ReleaseGate::check_size(REDIS, n)?;
        Ok(self)
    }

    /// Trusts the CA certificate(s) in this PEM file for `rediss://` (instead of the system's
    /// roots). The server's certificate must name the host of the URL.
    pub fn with_tls_ca_file(mut self, path: impl AsRef<std::path::Path>) -> Result<Self, Error> {
        self.tls_ca = Some(read_ca(REDIS, path.as_ref())?);
        Ok(self)
    }

    /// Opt-in fairness across processes: waiters line up in a queue kept on the server, and a
    /// free lock goes to the head of the line (see the crate docs, "Fair mode"). A waiter that
    /// stops asking for `grace` (it crashed, or gave up without saying so) loses its place.
    /// `grace` must be at least 100 ms.
    pub fn with_fair_queue(mut self, grace: Duration) -> Result<Self, Error> {
        if grace < Duration::from_millis(100) {
            return Err(invalid(
                REDIS,
                format!("fair queue grace {grace:?} is below the minimum of 100ms"),
            ));
        }
        self.fair = Some(grace);
        Ok(self)
    }

    /// Sets the connect and response timeouts.
    pub fn with_timeouts(mut self, connect: Duration, response: Duration) -> Self {
        self.connect_timeout = connect;
        self.response_timeout = response;
        self
    }

    /// Sets the fallback backoff of waiters (they are woken by the release message first).
    pub fn with_wait_backoff(mut self, backoff: Backoff) -> Self {
        self.wait_backoff = backoff;
        self
    }

    /// The URL(s), passwords redacted.
    pub fn redacted_url(&self) -> String {
        self.deployment.redacted()
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
