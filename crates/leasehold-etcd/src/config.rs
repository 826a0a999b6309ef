//! The backend's configuration and its URL form.

use std::fmt;
use std::time::Duration;

use leasehold_core::redaction::MASK;
use leasehold_core::{Error, ErrorKind, ReleaseGate};

use crate::NAME;

/// URL schemes this driver accepts: `etcd://` (plain gRPC) and `etcds://` (TLS through rustls;
/// needs the crate feature `tls`).
pub const SCHEMES: &[&str] = &["etcd", "etcds"];

/// The key prefix used unless configured otherwise.
pub const DEFAULT_PREFIX: &str = "leasehold/";

/// How acquisitions are tied to etcd leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum LeaseMode {
    /// One session lease per backend instance, granted at connect (and again after it is lost),
    /// kept alive over one keep-alive stream and shared by every acquisition of the instance.
    /// One lock costs one write (plus one to release). The default.
    #[default]
    Session,
    /// A lease granted for each acquisition (TTL = the request's TTL rounded up to whole
    /// seconds, at least the server's minimum), kept alive on its own stream and revoked on
    /// release: independent expiry, at the price of two more writes per lock.
    PerLock,
}

/// TLS settings (crate feature `tls`): server verification against a CA, and an optional
/// client certificate.
#[cfg(feature = "tls")]
#[derive(Clone, Default)]
#[non_exhaustive]
pub struct TlsConfig {
    /// PEM of the CA that signed the servers' certificates. Required: no system roots are
    /// used, so [`EtcdConfig::validate`] refuses TLS without it.
    pub ca_pem: Option<Vec<u8>>,
    /// The server name to verify, when it differs from the endpoint's host.
    pub domain: Option<String>,
    /// Client certificate and key (PEM), for servers that require client authentication.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

#[cfg(feature = "tls")]
impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("ca_pem", &self.ca_pem.as_ref().map(|c| c.len()))
            .field("domain", &self.domain)
            .field("identity", &self.identity.as_ref().map(|_| MASK))
            .finish()
    }
}

/// Where and how to reach etcd.
///
/// Build it with [`EtcdConfig::new`] and the `with_*` methods, or parse a URL with
/// [`EtcdConfig::from_url`]. Its `Debug` output never shows the password.
#[derive(Clone)]
#[non_exhaustive]
pub struct EtcdConfig {
    /// Client endpoints, `host:port` (or `http://host:port`).
    pub endpoints: Vec<String>,
    /// User name, for etcd's authentication.
    pub user: Option<String>,
    /// Password of `user`. Never printed.
    pub password: Option<String>,
    /// Prefix of every lock name (default [`DEFAULT_PREFIX`], `"leasehold/"`): lock `K` lives
    /// under `<prefix>K/`. May be empty.
    pub prefix: String,
    /// How acquisitions are tied to leases (default [`LeaseMode::Session`]).
    pub lease_mode: LeaseMode,
    /// TTL of the session lease granted on connecting, to check that leases can be granted
    /// (default 10 s). Locks do not all use it: each lock goes on the session lease of its own
    /// TTL (rounded up to whole seconds, at least 2 s), one shared lease per distinct TTL, so
    /// a crashed holder's lock is free again within its TTL rounded up.
    pub session_ttl: Duration,
    /// Time limit of each request to etcd (default 5 s).
    pub request_timeout: Duration,
    /// Time limit of connecting to an endpoint (default 3 s).
    pub connect_timeout: Duration,
    /// Bound on the release calls in flight at once (default
    /// [`RELEASES_IN_FLIGHT`](leasehold_core::RELEASES_IN_FLIGHT), at least 1): the others
    /// wait their turn (see [`ReleaseGate`](leasehold_core::ReleaseGate)). Permits and
    /// elections made from the backend share it.
    pub releases_in_flight: usize,
    /// TLS settings; `None` for plain gRPC.
    #[cfg(feature = "tls")]
    pub tls: Option<TlsConfig>,
    /// Whether a password may go to a non-loopback endpoint over plain gRPC (`http://`):
    /// `true` (the default) warns, `false` (`allow_plaintext_password=false`) refuses to
    /// connect. See [`leasehold_core::transport`].
    pub allow_plaintext_password: bool,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("EtcdConfig");
        d.field("endpoints", &self.endpoints)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| MASK))
            .field("prefix", &self.prefix)
            .field("lease_mode", &self.lease_mode)
            .field("session_ttl", &self.session_ttl)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("releases_in_flight", &self.releases_in_flight)
            .field("allow_plaintext_password", &self.allow_plaintext_password);
        #[cfg(feature = "tls")]
        d.field("tls", &self.tls);
        d.finish()
    }
}

impl EtcdConfig {
    /// A configuration for these endpoints (`host:port`), with every default.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            user: None,
            password: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            lease_mode: LeaseMode::Session,
            session_ttl: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            releases_in_flight: leasehold_core::RELEASES_IN_FLIGHT,
            #[cfg(feature = "tls")]
            tls: None,
            allow_plaintext_password: true,
        }
    }

    /// Parses `etcd://[user[:password]@]host:port[,host:port…][/][?option=value&…]`.
    ///
    /// Options: `prefix` (the key prefix, may be empty), `lease` (`session` or `per-lock`),
    /// `session_ttl` (seconds), `timeout_ms` (request timeout), `connect_timeout_ms`,
    /// `releases_in_flight` ([`releases_in_flight`](Self::releases_in_flight)),
    /// `allow_plaintext_password` (`false`: refuse to send the password to a non-loopback
    /// endpoint without TLS; by default that only warns). With the
    /// `tls` feature, `etcds://` turns TLS on and takes `ca` (path of a PEM CA file,
    /// required), `domain`, and `cert` + `key` (paths of the client certificate and key, PEM)
    /// for servers that authenticate clients. User and password may be percent-encoded. Errors
    /// never repeat the password.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        leasehold_core::redaction::refuse_unencoded_userinfo(NAME, url)?;
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| invalid("an etcd URL starts with etcd:// or etcds://"))?;
        let tls = match scheme {
            "etcd" => false,
            "etcds" => true,
            // The text is not quoted: before `://` may be anything, a password included.
            _ => {
                return Err(invalid(format!(
                    "not an etcd URL: the scheme must be one of {SCHEMES:?}"
                )));
            }
        };
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let authority_and_path = before_query;
        let (authority, path) = authority_and_path
            .split_once('/')
            .unwrap_or((authority_and_path, ""));
        if !path.is_empty() {
            return Err(invalid(
                "an etcd URL takes no path; set the key prefix with ?prefix=…",
            ));
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let endpoints = endpoints(hosts)?;
        let mut cfg = Self::new(endpoints);
        if let Some(userinfo) = userinfo {
            let (user, password) = credentials(userinfo)?;
            cfg.user = Some(user);
            cfg.password = Some(password);
        }
        #[cfg(feature = "tls")]
        let mut tls_cfg = TlsConfig::default();
        #[cfg(feature = "tls")]
        let mut identity: (Option<String>, Option<String>) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v).ok_or_else(|| invalid(format!("bad %-escape in {k}")))?;
            match k {
                "prefix" => cfg.prefix = v,
                "lease" => {
                    cfg.lease_mode = match v.as_str() {
                        "session" => LeaseMode::Session,
                        "per-lock" | "per_lock" => LeaseMode::PerLock,
                        other => {
                            return Err(invalid(format!(
                                "lease={other:?}: expected session or per-lock"
                            )));
                        }
                    }
                }
                "session_ttl" => cfg.session_ttl = Duration::from_secs(number(k, &v)?),
                "timeout_ms" => cfg.request_timeout = Duration::from_millis(number(k, &v)?),
                "connect_timeout_ms" => cfg.connect_timeout = Duration::from_millis(number(k, &v)?),
                leasehold_core::RELEASES_IN_FLIGHT_OPTION => {
                    cfg.releases_in_flight = ReleaseGate::parse_size(NAME, &v)?;
                }
                leasehold_core::transport::ALLOW_PLAINTEXT_PASSWORD => {
                    cfg.allow_plaintext_password =
                        leasehold_core::transport::parse_allow_plaintext(NAME, &v)?;
                }
                #[cfg(feature = "tls")]
                "ca" if tls => tls_cfg.ca_pem = Some(read_pem("ca", &v)?),
                #[cfg(feature = "tls")]
                "domain" if tls => tls_cfg.domain = Some(v),
                #[cfg(feature = "tls")]
                "cert" if tls => identity.0 = Some(v),
                #[cfg(feature = "tls")]
                "key" if tls => identity.1 = Some(v),
                other => return Err(invalid(format!("unknown option {other:?} in the etcd URL"))),
            }
        }
        if tls {
            #[cfg(feature = "tls")]
            {
                tls_cfg.identity = match identity {
                    (None, None) => None,
                    (Some(cert), Some(key)) => {
                        Some((read_pem("cert", &cert)?, read_pem("key", &key)?))
                    }
                    _ => {
                        return Err(invalid(
                            "`cert` and `key` (the client identity) go together",
                        ));
                    }
                };
                cfg.tls = Some(tls_cfg);
            }
            #[cfg(not(feature = "tls"))]
            return Err(invalid(
                "etcds:// needs leasehold-etcd's `tls` feature (rustls)",
            ));
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Sets user and password for etcd's authentication.
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self.password = Some(password.into());
        self
    }

    /// Sets the key prefix (no NUL byte; may be empty).
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Result<Self, Error> {
        self.prefix = prefix.into();
        if self.prefix.contains('\0') {
            return Err(invalid("the key prefix contains a NUL byte"));
        }
        Ok(self)
    }

    /// Sets the lease mode.
    pub fn with_lease_mode(mut self, mode: LeaseMode) -> Self {
        self.lease_mode = mode;
        self
    }

    /// Whether a password may go to a non-loopback endpoint without TLS (default `true`, with
    /// a warning); `false` refuses to connect.
    pub fn with_plaintext_password(mut self, allow: bool) -> Self {
        self.allow_plaintext_password = allow;
        self
    }

    /// Whether the connection uses TLS.
    pub fn is_tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        return false;
    }

    /// Sets the TTL of the session lease granted on connecting (see
    /// [`session_ttl`](Self::session_ttl)).
    pub fn with_session_ttl(mut self, ttl: Duration) -> Self {
        self.session_ttl = ttl;
        self
    }

    /// Sets the time limit of each request.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`releases_in_flight`](Self::releases_in_flight) (at least 1).
    pub fn with_releases_in_flight(mut self, n: usize) -> Result<Self, Error> {
        self.releases_in_flight = ReleaseGate::check_size(NAME, n)?;
        Ok(self)
    }

    /// Turns TLS on.
    #[cfg(feature = "tls")]
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Checks the values.
    pub fn validate(&self) -> Result<(), Error> {
        if self.endpoints.is_empty() {
            return Err(invalid("no etcd endpoint"));
        }
        if self.session_ttl < Duration::from_secs(1) {
            return Err(invalid(format!(
                "session_ttl {:?} is below etcd's granularity of one second",
                self.session_ttl
            )));
        }
        if self.session_ttl > Duration::from_secs(i64::MAX as u64 / 2) {
            return Err(invalid("session_ttl is absurdly long"));
        }
        if self.request_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(invalid("timeouts must be positive"));
        }
        if self.prefix.contains('\0') {
            return Err(invalid("the key prefix contains a NUL byte"));
        }
        ReleaseGate::check_size(NAME, self.releases_in_flight)?;
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.tls {
            // This crate's rustls has no built-in or system roots: without the CA, no server
            // certificate could ever be verified, so say so now rather than at the handshake.
            let Some(ca) = &tls.ca_pem else {
                return Err(invalid(
                    "TLS needs the CA certificate that signed the etcd servers' certificates: \
                     add ca=/path/to/ca.pem to the etcds:// URL (or set TlsConfig::ca_pem); \
                     no system roots are used",
                ));
            };
            if !ca.windows(CERT_PEM.len()).any(|w| w == CERT_PEM.as_bytes()) {
                return Err(invalid(
                    "the TLS CA holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                ));
            }
        }
        Ok(())
    }
}

#[cfg(feature = "tls")]
const CERT_PEM: &str = "-----BEGIN CERTIFICATE-----";

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidConfig, NAME, msg)
}

fn number(key: &str, v: &str) -> Result<u64, Error> {
    v.parse()
        .map_err(|_| invalid(format!("{key}={v:?} is not a whole number")))
}

/// Decodes `%XX` escapes; `None` if the result is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(Into::into)
}

/// The `host:port` endpoints of an etcd URL's authority, each with a port.
fn endpoints(hosts: &str) -> Result<Vec<String>, Error> {
    let endpoints: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
        .collect();
    if endpoints.is_empty() {
        return Err(invalid("an etcd URL needs at least one host:port"));
    }
    for (i, e) in endpoints.iter().enumerate() {
        if !e.contains(':') {
            // Not quoted: a password holding `/ ? #` unencoded ends up here.
            return Err(invalid(format!(
                "endpoint {} of {} has no port (etcd listens on 2379 by default; \
                 percent-encode a password holding `/ ? # @`)",
                i + 1,
                endpoints.len()
            )));
        }
    }
    Ok(endpoints)
}

/// User and password of an etcd URL's userinfo, percent-decoded (no password: empty).
fn credentials(userinfo: &str) -> Result<(String, String), Error> {
    let (user, password) = match userinfo.split_once(':') {
        Some((u, p)) => (u, Some(p)),
        None => (userinfo, None),
    };
    let user = percent_decode(user).ok_or_else(|| invalid("bad %-escape in the user"))?;
    if user.is_empty() {
        return Err(invalid("empty user name in the etcd URL"));
    }
    let password = match password {
        Some(p) => percent_decode(p).ok_or_else(|| invalid("bad %-escape in the password"))?,
        None => String::new(),
    };
    Ok((user, password))
}

/// Reads the PEM file an `etcds://` option (`ca`, `cert`, `key`) names.
#[cfg(feature = "tls")]
fn read_pem(option: &str, path: &str) -> Result<Vec<u8>, Error> {
    let what = match option {
        "ca" => "the CA file",
        "cert" => "the client certificate file",
        _ => "the client key file",
    };
    leasehold_core::transport::read_tls_file(std::path::Path::new(path))
        .map_err(|e| invalid(format!("cannot read {what} {path:?} (`{option}`): {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_url() {
        let cfg = EtcdConfig::from_url(
            "etcd://root:s%40cret@127.0.0.1:2379,127.0.0.1:22379?prefix=app/&lease=per-lock&session_ttl=7&timeout_ms=900&releases_in_flight=11",
        )
        .unwrap();
        assert_eq!(cfg.endpoints, vec!["127.0.0.1:2379", "127.0.0.1:22379"]);
        assert_eq!(cfg.user.as_deref(), Some("root"));
        assert_eq!(cfg.password.as_deref(), Some("s@cret"));
        assert_eq!(cfg.prefix, "app/");
        assert_eq!(cfg.lease_mode, LeaseMode::PerLock);
        assert_eq!(cfg.session_ttl, Duration::from_secs(7));
        assert_eq!(cfg.request_timeout, Duration::from_millis(900));
        assert_eq!(cfg.releases_in_flight, 11);
        let dbg = format!("{cfg:?}");
        assert!(
            !dbg.contains("s@cret") && !dbg.contains("s%40cret"),
            "{dbg}"
        );
        assert!(dbg.contains(MASK), "{dbg}");
    }

    #[test]
    fn a_foreign_scheme_is_not_quoted() {
        // Found by the `url` fuzz target: the text before `://` was quoted whole.
        let e = EtcdConfig::from_url("user:Hx7SECRETq@h://x")
            .err()
            .map(|e| format!("{e} {e:?}"))
            .unwrap_or_default();
        assert!(
            e.contains("not an etcd URL") && !e.contains("SECRET"),
            "{e}"
        );
    }

    #[test]
    fn defaults_and_errors() {
        let cfg = EtcdConfig::from_url("etcd://h:1").unwrap();
        assert_eq!(cfg.prefix, DEFAULT_PREFIX);
        assert_eq!(cfg.lease_mode, LeaseMode::Session);
        assert!(cfg.password.is_none());
        assert_eq!(cfg.releases_in_flight, leasehold_core::RELEASES_IN_FLIGHT);
        assert_eq!(
            cfg.with_releases_in_flight(0).err().map(|e| e.kind()),
            Some(ErrorKind::InvalidConfig)
        );
        for bad in [
            "etcd://h:1?releases_in_flight=0",
            "redis://h:1",
            "etcd://",
            "etcd://h",
            "etcd://h:1/path",
            "etcd://h:1?lease=forever",
            "etcd://h:1?session_ttl=0",
            "etcd://h:1?nope=1",
            "h:1",
        ] {
            let e = EtcdConfig::from_url(bad).err();
            assert_eq!(
                e.as_ref().map(Error::kind),
                Some(ErrorKind::InvalidConfig),
                "{bad}"
            );
        }
        let e = EtcdConfig::from_url("etcd://u:hunter2@h:1?lease=x").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
        #[cfg(not(feature = "tls"))]
        assert_eq!(
            EtcdConfig::from_url("etcds://h:1").err().map(|e| e.kind()),
            Some(ErrorKind::InvalidConfig)
        );
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_needs_a_ca_certificate() {
        let e = EtcdConfig::from_url("etcds://u:hunter2@h:1").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidConfig);
        assert!(e.to_string().contains("ca="), "{e}");
        assert!(!e.to_string().contains("hunter2"), "{e}");
        let tls = TlsConfig {
            ca_pem: Some(b"junk".to_vec()),
            ..TlsConfig::default()
        };
        let e = EtcdConfig::new(["h:1"])
            .with_tls(tls)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("no PEM certificate"), "{e}");
        let pem = b"-----BEGIN CERTIFICATE-----\nMII=\n-----END CERTIFICATE-----\n";
        let tls = TlsConfig {
            ca_pem: Some(pem.to_vec()),
            ..TlsConfig::default()
        };
        EtcdConfig::new(["h:1"]).with_tls(tls).validate().unwrap();
    }

    #[cfg(feature = "tls")]
    #[test]
    fn the_client_identity_is_a_url_option() {
        let dir = std::env::temp_dir().join(format!("leasehold-etcd-id-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let pem = b"-----BEGIN CERTIFICATE-----\nMII=\n-----END CERTIFICATE-----\n";
        for f in ["ca.pem", "cert.pem", "key.pem"] {
            std::fs::write(dir.join(f), pem).unwrap();
        }
        let d = dir.display();
        let cfg = EtcdConfig::from_url(&format!(
            "etcds://h:1?ca={d}/ca.pem&cert={d}/cert.pem&key={d}/key.pem"
        ))
        .unwrap();
        let identity = cfg.tls.as_ref().and_then(|t| t.identity.as_ref());
        assert_eq!(
            identity.map(|(c, k)| (c.len(), k.len())),
            Some((pem.len(), pem.len()))
        );
        let half = EtcdConfig::from_url(&format!("etcds://h:1?ca={d}/ca.pem&cert={d}/cert.pem"))
            .unwrap_err();
        assert!(half.to_string().contains("go together"), "{half}");
        let missing =
            EtcdConfig::from_url(&format!("etcds://h:1?ca={d}/ca.pem&cert={d}/no&key={d}/no"))
                .unwrap_err();
        assert_eq!(missing.kind(), ErrorKind::InvalidConfig);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
