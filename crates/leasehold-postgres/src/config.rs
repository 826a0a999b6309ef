//! Configuration: connection strings (URLs and libpq key=value strings) plus leasehold's own
//! settings.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use leasehold_core::{Error, ReleaseGate};
use tokio_postgres::config::SslMode;

use crate::NAME;
use crate::conninfo::{invalid, params_given, split_key_values, split_url};
use crate::tls::{self, Roots, Tls, TlsMode};

/// The URL schemes this backend accepts.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];

/// The default key prefix: none (a key `K` is hashed as `K`; with a prefix `P`, as `P K`).
pub const DEFAULT_PREFIX: &str = "";

/// Default period of the health check on every lock session.
pub const DEFAULT_HEALTH_INTERVAL: Duration = Duration::from_millis(250);
/// Default time a health check may take before the session counts as lost.
pub const DEFAULT_HEALTH_TIMEOUT: Duration = Duration::from_millis(500);
/// Default bound on the sessions (server connections) one backend opens: lock sessions, which
/// carry any number of locks each, and sessions lent to a waiting acquisition, together.
pub const DEFAULT_MAX_SESSIONS: usize = 10;
/// Default `application_name` of every session (shows in `pg_stat_activity`), unless the
/// connection string sets one.
pub const DEFAULT_APPLICATION_NAME: &str = "leasehold";
/// Default time a session that holds no lock is kept before it is closed.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default schema of the fencing sequence.
pub const DEFAULT_FENCE_SCHEMA: &str = "public";
/// Default name of the fencing sequence.
pub const DEFAULT_FENCE_SEQUENCE: &str = "leasehold_fence";

/// Longest identifier PostgreSQL keeps (NAMEDATALEN − 1).
const MAX_IDENT: usize = 63;
/// Longest key prefix accepted.
const MAX_PREFIX: usize = 256;

/// How [`PostgresBackend`](crate::PostgresBackend) connects and behaves.
///
/// Built from a connection string with [`from_url`](Self::from_url) (or `str::parse`), which
/// accepts
///
/// - URLs: `postgres://user:password@host:port/dbname?param=value&…` (also `postgresql://`;
///   a host that is a directory path, percent-encoded, or `?host=/path/to/socket/dir`, is a
///   unix socket);
/// - libpq key=value strings: `host=/var/run/postgresql port=5432 user=app dbname=app`
///   (values may be single-quoted).
///
/// Every libpq parameter tokio-postgres understands is passed through (`user`, `password`,
/// `dbname`, `host`, `port`, `application_name`, `options`, `connect_timeout`,
/// `keepalives*`, `tcp_user_timeout`, `target_session_attrs`, …). On top of them:
///
/// | parameter | default | meaning |
/// |---|---|---|
/// | `prefix` | empty | namespace prepended to every key before it is hashed |
/// | `fence_schema` | `public` | schema of the fencing sequence |
/// | `fence_sequence` | `leasehold_fence` | name of the fencing sequence (created if missing) |
/// | `health_interval_ms` | 250 | period of the health check on each lock session |
/// | `health_timeout_ms` | 500 | how long one health check may take |
/// | `max_sessions` | 10 | bound on the server connections of one backend (≥ 1); see below |
/// | `idle_timeout_ms` | 60000 | a session holding no lock, unused for this long, is closed |
/// | `releases_in_flight` | 256 | bound on the backend's release calls in flight at once (≥ 1; see [`ReleaseGate`](leasehold_core::ReleaseGate)) |
/// | `sslmode` | `prefer` | see *TLS* below |
/// | `allow_plaintext_password` | `true` | `false`: refuse to send a password without TLS to a host that is not loopback (by default that only warns); see *TLS* |
/// | `advisory_keys` | `false` | `true`: keys `advisory:<n>` name the advisory-lock key `n` itself, bypassing the prefix (see the crate's *Key mapping*) |
/// | `sslrootcert` | system roots | PEM file of the CA certificate(s) to trust; `system`: the operating system's store |
///
/// Unless the string sets them, TCP keepalives are on with a 15 s idle time, a 5 s interval
/// and 3 probes, connecting times out after 10 s, and `application_name` is `leasehold`
/// ([`DEFAULT_APPLICATION_NAME`]), so `pg_stat_activity` shows the backend's sessions.
///
/// # Sessions
///
/// `max_sessions` is the one bound on the connections a backend opens: the lock sessions
/// (each carries any number of advisory locks) and the sessions lent to waiting acquisitions
/// for their `pg_advisory_lock` count together, so one process never holds more than
/// `max_sessions` connections, whatever the number of leases. The idle timeout only closes
/// sessions that hold no lock and are not in use; it shrinks the pool after a burst and never
/// raises the bound. `max_idle_sessions` (the bound of earlier versions, on *idle* sessions,
/// with one session per held lock) is refused with a message that names `max_sessions`.
///
/// # TLS
///
/// TLS is rustls with the *ring* provider (TLS 1.2 and 1.3). `sslmode`:
///
/// - `disable`, `allow`: **no TLS** (`allow` does not retry with TLS, unlike libpq).
/// - `prefer` (the default): as in libpq, **TLS first**, the certificate not verified, and
///   plaintext only if the server refuses TLS or the handshake fails. Encryption then stops
///   a passive eavesdropper; an active attacker can still force plaintext or present any
///   certificate, so ask for `verify-full` where that matters. (Earlier versions read `prefer`
///   as "no TLS at all", so a default connection sent its password in clear.)
/// - `require`: encrypted, but the server's certificate is **not verified** (any certificate
///   is accepted, as in libpq): protects against passive eavesdropping only. As in libpq,
///   `require` together with an explicit `sslrootcert` file behaves as `verify-ca`.
/// - `verify-ca`: encrypted; the certificate must chain to a trusted root (the `sslrootcert`
///   file, else the system's roots); its host name is not checked.
/// - `verify-full`: as `verify-ca`, and the certificate must name the host the connection
///   string gives (`host`; a DNS name or an IP address, matched against the certificate's
///   subject alternative names). With `hostaddr`, the name checked is still `host`.
///
/// The root file is read when the configuration is built: a missing, unreadable or empty
/// file is an [`ErrorKind::InvalidConfig`](leasehold_core::ErrorKind::InvalidConfig) error then. A certificate that fails
/// verification makes connecting fail with [`ErrorKind::Unavailable`](leasehold_core::ErrorKind::Unavailable) (the TLS error is in
/// the message). Unix sockets never use TLS (as in libpq).
///
/// **What TLS costs a lock cycle.** Every statement of an encrypted session is a TLS record
/// each way, encrypted and decrypted on both sides: on a fast network (loopback) that is a
/// visible part of an uncontended acquire + release, which is two statements. The default
/// `prefer` pays it whenever the server has `ssl=on`. Where the path to the server needs no
/// encryption (a unix socket, which never uses TLS, or loopback), `sslmode=disable` avoids
/// it; `pg_stat_ssl` tells which sessions are encrypted.
///
/// **A password in clear.** When a session is about to send a password without TLS
/// (`disable`, `allow`, or `prefer` that fell back) to a host that is not loopback
/// ([`leasehold_core::transport::is_loopback_host`]: an IP outside `127.0.0.0/8` and `::1`, or
/// a name other than `localhost`), it logs a `warn!` (target `leasehold.plaintext`); with
/// `allow_plaintext_password=false` it refuses to connect instead
/// ([`ErrorKind::InvalidConfig`](leasehold_core::ErrorKind::InvalidConfig)), before anything is sent in clear.
///
/// `Debug` never shows the password.
#[derive(Clone)]
pub struct PostgresConfig {
    pub(crate) pg: tokio_postgres::Config,
    pub(crate) tls_mode: TlsMode,
    pub(crate) roots: Roots,
    pub(crate) tls: Option<Tls>,
    pub(crate) prefix: String,
    pub(crate) fence_schema: String,
    pub(crate) fence_sequence: String,
    pub(crate) health_interval: Duration,
    pub(crate) health_timeout: Duration,
    pub(crate) max_sessions: usize,
    pub(crate) releases_in_flight: usize,
    pub(crate) idle_timeout: Duration,
    pub(crate) allow_plaintext_password: bool,
    pub(crate) advisory_keys: bool,
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // tokio-postgres' own Debug redacts the password (it prints `_`).
        f.debug_struct("PostgresConfig")
            .field("pg", &self.pg)
            .field("prefix", &self.prefix)
            .field("fence_schema", &self.fence_schema)
            .field("fence_sequence", &self.fence_sequence)
            .field("health_interval", &self.health_interval)
            .field("health_timeout", &self.health_timeout)
            .field("max_sessions", &self.max_sessions)
            .field("releases_in_flight", &self.releases_in_flight)
            .field("idle_timeout", &self.idle_timeout)
            .field("sslmode", &self.tls_mode.as_str())
            .field("roots", &self.roots)
            .field("allow_plaintext_password", &self.allow_plaintext_password)
            .field("advisory_keys", &self.advisory_keys)
            .finish()
    }
}

impl FromStr for PostgresConfig {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        Self::from_url(s)
    }
}

impl PostgresConfig {
    /// Parses a `postgres://` / `postgresql://` URL or a libpq key=value string (see the type's
    /// documentation). Errors never quote the string, which may hold a password.
    pub fn from_url(s: &str) -> Result<Self, Error> {
        let is_url = SCHEMES
            .iter()
            .any(|scheme| s.strip_prefix(scheme).is_some_and(|r| r.starts_with("://")));
        let (rest, params) = if is_url {
            leasehold_core::redaction::refuse_unencoded_userinfo(NAME, s)?;
            split_url(s)?
        } else {
            split_key_values(s)?
        };
        let pg = tokio_postgres::Config::from_str(&rest).map_err(|e| {
            // tokio-postgres' parse errors name the option, never its value.
            invalid(format!("invalid connection string: {e}"))
        })?;
        let given = |k: &str| params_given(&rest, k);
        let mut cfg = Self::with_defaults(pg, &given);
        for (key, value) in &params {
            cfg.apply(key, value)?;
        }
        cfg.build_tls()?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Wraps an already built tokio-postgres configuration, with leasehold's defaults (its
    /// keepalive settings are kept). Its `ssl_mode` `require` means leasehold's `require`
    /// (encrypted, certificate not verified; see *TLS* in the type's documentation); use
    /// [`with_tls`](Self::with_tls) to verify the server.
    pub fn from_pg_config(pg: tokio_postgres::Config) -> Result<Self, Error> {
        let mut cfg = Self::with_defaults(pg, &|_| true);
        cfg.build_tls()?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Sets TLS as the `sslmode` and `sslrootcert` parameters would (see *TLS* in the type's
    /// documentation); `root_cert` `None` means the system's roots. Reads the root file now.
    pub fn with_tls(mut self, sslmode: &str, root_cert: Option<&Path>) -> Result<Self, Error> {
        self.tls_mode = TlsMode::parse(sslmode)?;
        self.roots = root_cert.map_or(Roots::System, |p| Roots::File(p.to_path_buf()));
        self.build_tls()?;
        self.validate()?;
        Ok(self)
    }

    /// The effective `sslmode`: `disable`, `prefer`, `require`, `verify-ca` or `verify-full`
    /// (`allow` reads as `disable`; `require` with an `sslrootcert` file as `verify-ca`).
    pub fn ssl_mode(&self) -> &'static str {
        self.tls_mode.as_str()
    }

    /// Applies libpq's `require` + root file rule, sets tokio-postgres' own `sslmode` to
    /// match (`require` for every mode that tries TLS: `prefer` falls back by a second
    /// connection without TLS, see the session module) and builds the rustls connector.
    fn build_tls(&mut self) -> Result<(), Error> {
        if self.tls_mode == TlsMode::Require && matches!(self.roots, Roots::File(_)) {
            self.tls_mode = TlsMode::VerifyCa;
        }
        self.pg.ssl_mode(if self.tls_mode == TlsMode::Off {
            SslMode::Disable
        } else {
            SslMode::Require
        });
        self.tls = tls::build(self.tls_mode, &self.roots)?;
        Ok(())
    }

    /// Leasehold's defaults around `pg`; keepalive settings the user `given` are kept.
    fn with_defaults(mut pg: tokio_postgres::Config, given: &dyn Fn(&str) -> bool) -> Self {
        if !given("keepalives") && !given("keepalives_idle") {
            pg.keepalives(true);
            pg.keepalives_idle(Duration::from_secs(15));
        }
        if !given("keepalives_interval") {
            pg.keepalives_interval(Duration::from_secs(5));
        }
        if !given("keepalives_retries") {
            pg.keepalives_retries(3);
        }
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(Duration::from_secs(10));
        }
        if pg.get_application_name().is_none() {
            pg.application_name(DEFAULT_APPLICATION_NAME);
        }
        let tls_mode = match pg.get_ssl_mode() {
            SslMode::Require => TlsMode::Require,
            SslMode::Disable => TlsMode::Off,
            _ => TlsMode::Prefer,
        };
        Self {
            pg,
            tls_mode,
            roots: Roots::System,
            tls: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            fence_schema: DEFAULT_FENCE_SCHEMA.to_owned(),
            fence_sequence: DEFAULT_FENCE_SEQUENCE.to_owned(),
            health_interval: DEFAULT_HEALTH_INTERVAL,
            health_timeout: DEFAULT_HEALTH_TIMEOUT,
            max_sessions: DEFAULT_MAX_SESSIONS,
            releases_in_flight: leasehold_core::RELEASES_IN_FLIGHT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            allow_plaintext_password: true,
            advisory_keys: false,
        }
    }

    fn apply(&mut self, key: &str, value: &str) -> Result<(), Error> {
        let flag = |v: &str| {
            leasehold_core::transport::parse_allow_plaintext(NAME, v)
                .map_err(|_| invalid(format!("{key} must be true or false")))
        };
        let millis = |v: &str| -> Result<Duration, Error> {
            v.parse::<u64>()
                .ok()
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis)
                .ok_or_else(|| invalid(format!("{key} must be a positive number of milliseconds")))
        };
        match key {
            "prefix" => self.prefix = value.to_owned(),
            "fence_schema" => self.fence_schema = value.to_owned(),
            "fence_sequence" => self.fence_sequence = value.to_owned(),
            "health_interval_ms" => self.health_interval = millis(value)?,
            "health_timeout_ms" => self.health_timeout = millis(value)?,
            "max_sessions" => {
                self.max_sessions = value
                    .parse()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| invalid("max_sessions must be a positive integer"))?;
            }
            "max_idle_sessions" => {
                return Err(invalid(
                    "max_idle_sessions was replaced by max_sessions, the bound on all of a \
                     backend's sessions (each carries any number of locks)",
                ));
            }
            leasehold_core::RELEASES_IN_FLIGHT_OPTION => {
                self.releases_in_flight = ReleaseGate::parse_size(NAME, value)?;
            }
            "idle_timeout_ms" => self.idle_timeout = millis(value)?,
            "sslmode" => self.tls_mode = TlsMode::parse(value)?,
            "sslrootcert" if value == "system" => self.roots = Roots::System,
            "sslrootcert" if value.is_empty() => {
                return Err(invalid("sslrootcert must be a file path or `system`"));
            }
            "sslrootcert" => self.roots = Roots::File(PathBuf::from(value)),
            "advisory_keys" => self.advisory_keys = flag(value)?,
            leasehold_core::transport::ALLOW_PLAINTEXT_PASSWORD => {
                self.allow_plaintext_password = flag(value)?;
            }
            _ => {}
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), Error> {
        for (what, ident) in [
            ("fence_schema", &self.fence_schema),
            ("fence_sequence", &self.fence_sequence),
        ] {
            if ident.is_empty() || ident.len() > MAX_IDENT || ident.contains('\0') {
                return Err(invalid(format!(
                    "{what} must be 1 to {MAX_IDENT} bytes without NUL"
                )));
            }
        }
        if self.prefix.len() > MAX_PREFIX || self.prefix.contains('\0') {
            return Err(invalid(format!(
                "prefix must be at most {MAX_PREFIX} bytes without NUL"
            )));
        }
        if self.max_sessions == 0 {
            return Err(invalid("max_sessions must be at least 1"));
        }
        if self.health_interval.is_zero() || self.health_timeout.is_zero() {
            return Err(invalid("health interval and timeout must be positive"));
        }
        if (self.pg.get_ssl_mode() == SslMode::Require) != self.tls.is_some() {
            return Err(invalid(
                "inconsistent TLS settings (tokio-postgres sslmode vs. leasehold's)",
            ));
        }
        if self.pg.get_hosts().is_empty() {
            return Err(invalid("no host given"));
        }
        Ok(())
    }

    /// Whether a session may send a password without TLS to a host that is not loopback
    /// (default `true`, with a warning); `false` refuses to connect (see *TLS* in the type's
    /// documentation).
    pub fn with_plaintext_password(mut self, allow: bool) -> Self {
        self.allow_plaintext_password = allow;
        self
    }

    /// Opts in to explicit numeric keys: with `true`, a key `advisory:<n>` is the advisory-lock
    /// key `n` itself, without the prefix (to share a lock with `pg_advisory_lock(n)`). Off by
    /// default: then `advisory:5` is a name like any other, hashed with the prefix.
    pub fn with_advisory_keys(mut self, on: bool) -> Self {
        self.advisory_keys = on;
        self
    }

    /// Whether keys `advisory:<n>` name advisory-lock keys directly.
    pub fn advisory_keys(&self) -> bool {
        self.advisory_keys
    }

    /// Sets the key namespace: every key is hashed as `prefix + key`.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Result<Self, Error> {
        self.prefix = prefix.into();
        self.validate()?;
        Ok(self)
    }

    /// Sets the schema and name of the fencing sequence (created if missing; the schema must
    /// exist).
    pub fn with_fence_sequence(
        mut self,
        schema: impl Into<String>,
        name: impl Into<String>,
    ) -> Result<Self, Error> {
        self.fence_schema = schema.into();
        self.fence_sequence = name.into();
        self.validate()?;
        Ok(self)
    }

    /// Sets the health-check period and the time one check may take. A lease's validity is
    /// the start of its last successful check plus `interval + timeout`.
    pub fn with_health(mut self, interval: Duration, timeout: Duration) -> Result<Self, Error> {
        self.health_interval = interval;
        self.health_timeout = timeout;
        self.validate()?;
        Ok(self)
    }

    /// Sets the bound on the backend's sessions (server connections), at least 1: see
    /// *Sessions* in the type's documentation.
    pub fn with_max_sessions(mut self, n: usize) -> Result<Self, Error> {
        self.max_sessions = n;
        self.validate()?;
        Ok(self)
    }

    /// The bound on the backend's sessions.
    pub fn max_sessions(&self) -> usize {
        self.max_sessions
    }

    /// Bounds the backend's release calls in flight at once (default
    /// [`RELEASES_IN_FLIGHT`](leasehold_core::RELEASES_IN_FLIGHT), at least 1): the others wait
    /// their turn (see [`ReleaseGate`]).
    pub fn with_releases_in_flight(mut self, n: usize) -> Result<Self, Error> {
        self.releases_in_flight = ReleaseGate::check_size(NAME, n)?;
        Ok(self)
    }

    /// Sets how long a session that holds no lock is kept: one unused for `timeout` is closed
    /// (by a task of the backend), so the pool shrinks back after a burst.
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Sets `application_name` on every session (shows in `pg_stat_activity`; default
    /// [`DEFAULT_APPLICATION_NAME`]).
    pub fn with_application_name(mut self, name: impl Into<String>) -> Self {
        self.pg.application_name(name.into());
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The health-check period.
    pub fn health_interval(&self) -> Duration {
        self.health_interval
    }

    /// The time one health check may take.
    pub fn health_timeout(&self) -> Duration {
        self.health_timeout
    }

    /// How long a lease stays valid after the start of its last successful health check:
    /// `health_interval + health_timeout`. Also the backend's shortest accepted TTL.
    pub fn validity_window(&self) -> Duration {
        self.health_interval.saturating_add(self.health_timeout)
    }

    /// The fully quoted name of the fencing sequence, e.g. `"public"."leasehold_fence"`.
    pub fn fence_sequence_sql(&self) -> String {
        format!(
            "{}.{}",
            quote_ident(&self.fence_schema),
            quote_ident(&self.fence_sequence)
        )
    }

    /// The underlying tokio-postgres configuration.
    pub fn pg_config(&self) -> &tokio_postgres::Config {
        &self.pg
    }
}

/// Double-quotes an identifier for SQL.
pub(crate) fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::ErrorKind;
    use tokio_postgres::config::Host;

    #[test]
    fn url_with_own_params() -> Result<(), Error> {
        let c = PostgresConfig::from_url(
            "postgresql://app:s3cr%40t@db.example:6543/locks?application_name=x&prefix=svc%2F&health_interval_ms=100&health_timeout_ms=300&fence_schema=lh&fence_sequence=seq&max_sessions=3&idle_timeout_ms=1500&releases_in_flight=9",
        )?;
        assert_eq!(c.prefix, "svc/");
        assert_eq!(c.health_interval, Duration::from_millis(100));
        assert_eq!(c.validity_window(), Duration::from_millis(400));
        assert_eq!(c.fence_sequence_sql(), "\"lh\".\"seq\"");
        assert_eq!(c.max_sessions, 3);
        assert_eq!(c.releases_in_flight, 9);
        assert_eq!(c.idle_timeout, Duration::from_millis(1500));
        assert_eq!(c.pg.get_user(), Some("app"));
        assert_eq!(c.pg.get_password(), Some(&b"s3cr@t"[..]));
        assert_eq!(c.pg.get_dbname(), Some("locks"));
        assert_eq!(c.pg.get_application_name(), Some("x"));
        assert_eq!(c.pg.get_ports(), &[6543]);
        assert!(c.pg.get_keepalives());
        assert_eq!(c.pg.get_keepalives_idle(), Duration::from_secs(15));
        let c2 = PostgresConfig::from_url("postgres://u@h/d?keepalives_idle=60")?;
        assert_eq!(c2.pg.get_keepalives_idle(), Duration::from_secs(60));
        assert_eq!(c2.pg.get_application_name(), Some(DEFAULT_APPLICATION_NAME));
        assert_eq!(c2.max_sessions, DEFAULT_MAX_SESSIONS);
        assert_eq!(c2.releases_in_flight, leasehold_core::RELEASES_IN_FLIGHT);
        for bad in ["releases_in_flight=0", "releases_in_flight=x"] {
            let e = PostgresConfig::from_url(&format!("postgres://u@h/d?{bad}")).err();
            assert_eq!(e.map(|e| e.kind()), Some(ErrorKind::InvalidConfig), "{bad}");
        }
        let c3 = PostgresConfig::from_url("host=h keepalives_idle = 61 user=u")?;
        assert_eq!(c3.pg.get_keepalives_idle(), Duration::from_secs(61));
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("s3cr"), "{dbg}");
        Ok(())
    }

    /// Found by the `url` fuzz target: a URL of another scheme (or a password without its
    /// key) read as `key = value` text was quoted whole in the error.
    #[test]
    fn a_malformed_key_value_string_is_not_quoted() {
        for s in [
            "redlock://user:Hx7SECRETq@\"\"#127.0.0.1:6379",
            "user:Hx7SECRETq@db",
            "host=h Hx7SECRETq",
        ] {
            let e = PostgresConfig::from_url(s)
                .err()
                .map(|e| format!("{e} {e:?}"));
            let e = e.unwrap_or_default();
            assert!(
                e.contains("expected `=`") && !e.contains("SECRET"),
                "{s}: {e}"
            );
        }
    }

    #[test]
    fn key_values_and_unix_socket() -> Result<(), Error> {
        let c = PostgresConfig::from_url(
            "host=/tmp/pg\\ sock port=5433 user=u password='it\\'s secret' dbname=d prefix='a b'",
        )?;
        assert_eq!(c.prefix, "a b");
        assert_eq!(c.pg.get_password(), Some(&b"it's secret"[..]));
        assert!(
            matches!(&c.pg.get_hosts()[0], Host::Unix(p) if p.to_str() == Some("/tmp/pg sock"))
        );
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("secret"), "{dbg}");
        Ok(())
    }

    #[test]
    fn ssl_modes() -> Result<(), Error> {
        for (s, mode, pg) in [
            ("postgres://u@h/d", "prefer", SslMode::Require),
            ("host=h user=u", "prefer", SslMode::Require),
            (
                "postgres://u@h/d?sslmode=prefer",
                "prefer",
                SslMode::Require,
            ),
            (
                "postgres://u@h/d?sslmode=disable",
                "disable",
                SslMode::Disable,
            ),
            (
                "postgres://u@h/d?sslmode=allow",
                "disable",
                SslMode::Disable,
            ),
            (
                "postgres://u@h/d?sslmode=require",
                "require",
                SslMode::Require,
            ),
            ("host=h user=u sslmode=require", "require", SslMode::Require),
        ] {
            let c = PostgresConfig::from_url(s)?;
            assert_eq!(c.ssl_mode(), mode, "{s}");
            assert_eq!(c.pg.get_ssl_mode(), pg, "{s}");
            assert_eq!(c.tls.is_some(), mode != "disable", "{s}");
        }
        let mut pg = tokio_postgres::Config::new();
        pg.host("h").ssl_mode(SslMode::Require);
        assert_eq!(PostgresConfig::from_pg_config(pg)?.ssl_mode(), "require");
        let mut pg = tokio_postgres::Config::new();
        pg.host("h");
        assert_eq!(PostgresConfig::from_pg_config(pg)?.ssl_mode(), "prefer");
        Ok(())
    }

    #[test]
    fn bad_configs_are_typed_and_do_not_echo_secrets() {
        for s in [
            "postgres://u:hunter2@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem",
            "postgres://u:hunter2@h/db?sslmode=bogus",
            "postgres://u:hunter2@h/db?sslrootcert=",
            "postgres://u:hunter2@h/db?health_interval_ms=0",
            "postgres://u:hunter2@h/db?fence_sequence=",
            "postgres://u:hunter2@h/db?max_sessions=0",
            "postgres://u:hunter2@h/db?max_sessions=many",
            "postgres://u:hunter2@h/db?max_idle_sessions=4",
            "postgres://u:hunter2@h/db?bogus=1",
            "postgres://u:hunter2@h/db?allow_plaintext_password=hunter2",
            "postgres://u:hunter2@h/db?advisory_keys=maybe",
            "postgres://u:hunter2@h:notaport/db",
            "host=h password=hunter2 sslmode=bogus",
            "host=h password='hunter2",
        ] {
            match PostgresConfig::from_url(s) {
                Ok(c) => panic!("{s:?} accepted: {c:?}"),
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{s}: {e}");
                    assert!(!e.to_string().contains("hunter2"), "{e}");
                }
            }
        }
    }
}
