//! `LockConfig`: choosing and tuning a backend by configuration.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use leasehold_core::{Backoff, Drift, Error, ErrorKind, LockOptions, Locker, Renewal};
use serde::Deserialize;

use crate::redact::redact;
use crate::registry::{CONFIG, Target, open, scheme_of};

/// What the locks of a configuration are for (DESIGN.md: efficiency or correctness).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Require {
    /// Any backend will do: a lost lock costs duplicate work, not corrupt data (the default).
    #[default]
    Efficiency,
    /// Only a backend with consensus-grade (or transactional) safety **and** strictly
    /// increasing, durable fencing tokens: PostgreSQL or etcd. Anything else fails
    /// [`LockConfig::build`] with the reason.
    Correctness,
}

impl fmt::Display for Require {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Efficiency => "efficiency",
            Self::Correctness => "correctness",
        })
    }
}

/// Automatic renewal, as written in configuration: `"off"`, `"auto"` (every `ttl / 3`) or an
/// interval such as `"5s"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RenewalSetting {
    /// No automatic renewal.
    Off,
    /// Every `ttl / 3`.
    Auto,
    /// At this interval.
    Every(Duration),
}

impl RenewalSetting {
    fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "off" => Ok(Self::Off),
            "auto" => Ok(Self::Auto),
            other => humantime::parse_duration(other)
                .map(Self::Every)
                .map_err(|e| format!("expected \"off\", \"auto\" or a duration like \"5s\": {e}")),
        }
    }

    fn to_core(self) -> Renewal {
        match self {
            Self::Off => Renewal::Off,
            Self::Auto => Renewal::Auto,
            Self::Every(d) => Renewal::Every(d),
        }
    }
}

impl<'de> Deserialize<'de> for RenewalSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Retry backoff of waiting acquisitions (`[backoff]`): `initial` and `max` delays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BackoffConfig {
    /// Upper bound of the first delay (default 10 ms).
    #[serde(default, with = "humantime_serde")]
    pub initial: Option<Duration>,
    /// Upper bound of every delay (default 500 ms).
    #[serde(default, with = "humantime_serde")]
    pub max: Option<Duration>,
}

/// The drift margin (`[drift]`): `ttl × factor + fixed`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct DriftConfig {
    /// Proportional part, in `[0, 1)` (default 0.01).
    #[serde(default)]
    pub factor: Option<f64>,
    /// Fixed part (default 2 ms).
    #[serde(default, with = "humantime_serde")]
    pub fixed: Option<Duration>,
}

/// The table form of a backend (`[backend]`), for keeping the password out of the URL (set it
/// from `LEASEHOLD_BACKEND_PASSWORD`, for example).
///
/// It becomes `scheme://[user[:password]@]host1,host2…[/database][?option=value&…]`, with user
/// and password percent-encoded; see each driver for the options it takes.
#[derive(Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BackendTable {
    /// The URL scheme: `redis`, `redlock`, `postgres`, `etcd`, … (see
    /// [`available_schemes`](crate::available_schemes)).
    pub scheme: String,
    /// `host:port` of each node (Redlock nodes, Redis Cluster seeds, etcd endpoints, PostgreSQL
    /// hosts); empty for `memory`.
    #[serde(default)]
    pub hosts: Vec<String>,
    /// User name.
    #[serde(default)]
    pub user: Option<String>,
    /// Password. Never printed.
    #[serde(default)]
    pub password: Option<String>,
    /// Database: a number for Redis, a name for PostgreSQL.
    #[serde(default)]
    pub database: Option<String>,
    /// Driver options, added as the URL's query string.
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

impl fmt::Debug for BackendTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendTable")
            .field("scheme", &self.scheme)
            .field("hosts", &self.hosts)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("database", &self.database)
            .field("options", &redact_options(&self.options))
            .finish()
    }
}

fn redact_options(options: &BTreeMap<String, String>) -> BTreeMap<&str, &str> {
    options
        .iter()
        .map(|(k, v)| {
            let shown = if k.eq_ignore_ascii_case("password") {
                "***"
            } else {
                v.as_str()
            };
            (k.as_str(), shown)
        })
        .collect()
}

impl BackendTable {
    /// The URL this table stands for (with the password: never print it; use
    /// [`redacted_url`](Self::redacted_url)).
    pub fn to_url(&self) -> String {
        let mut url = format!("{}://", self.scheme);
        if self.scheme == "memory" {
            return url;
        }
        if let Some(user) = &self.user {
            url.push_str(&percent_encode(user));
            if let Some(pw) = &self.password {
                url.push(':');
                url.push_str(&percent_encode(pw));
            }
            url.push('@');
        } else if let Some(pw) = &self.password {
            // Redis reads a bare userinfo as the password; give it an empty user.
            url.push(':');
            url.push_str(&percent_encode(pw));
            url.push('@');
        }
        url.push_str(&self.hosts.join(","));
        if let Some(db) = &self.database {
            url.push('/');
            url.push_str(&percent_encode(db));
        }
        if !self.options.is_empty() {
            let query: Vec<String> = self
                .options
                .iter()
                .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
                .collect();
            url.push('?');
            url.push_str(&query.join("&"));
        }
        url
    }

    /// The URL with its password replaced by `***`.
    pub fn redacted_url(&self) -> String {
        redact(&self.to_url())
    }
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// How to pick and tune a lock backend, from a TOML file, environment variables, or code.
///
/// ```toml
/// url = "redis://127.0.0.1:6379"        # or: urls = ["redis://a:6379", …] for Redlock,
///                                       # or a [backend] table (see BackendTable)
/// ttl = "30s"                           # lease duration
/// wait = "5s"                           # wait budget of LockLayer / Locker::acquire
/// renewal = "auto"                      # "off", "auto" (every ttl/3) or an interval
/// key_prefix = "billing:"               # namespace of every key (driver's own default if unset)
/// require = "correctness"               # or "efficiency" (the default)
///
/// [backoff]
/// initial = "10ms"
/// max = "500ms"
///
/// [drift]
/// factor = 0.01
/// fixed = "2ms"
/// ```
///
/// Durations are written as `"250ms"`, `"30s"`, `"1m 30s"` (the `humantime` format). Exactly
/// one of `url`, `urls` and `[backend]` must be given. Unknown keys are errors that name the
/// key; bad values are errors that name the field. [`LockConfig::build`] opens the backend
/// (see [`available_schemes`](crate::available_schemes) for the URL schemes) and checks the
/// requirement: with `require = "correctness"`, a backend without consensus-grade safety and
/// monotonic fencing tokens is refused, with the reason.
///
/// # Environment
///
/// [`with_env`](Self::with_env) (and [`load`](Self::load), [`from_env`](Self::from_env))
/// override fields from these variables:
///
/// | variable | field |
/// |---|---|
/// | `LEASEHOLD_URL` | `url` (and clears `urls` and `[backend]`) |
/// | `LEASEHOLD_URLS` | `urls`, comma-separated (and clears `url` and `[backend]`) |
/// | `LEASEHOLD_BACKEND_USER`, `LEASEHOLD_BACKEND_PASSWORD` | `backend.user`, `backend.password` |
/// | `LEASEHOLD_TTL`, `LEASEHOLD_WAIT` | `ttl`, `wait` |
/// | `LEASEHOLD_BACKOFF_INITIAL`, `LEASEHOLD_BACKOFF_MAX` | `backoff.initial`, `backoff.max` |
/// | `LEASEHOLD_RENEWAL` | `renewal` |
/// | `LEASEHOLD_DRIFT_FACTOR`, `LEASEHOLD_DRIFT_FIXED` | `drift.factor`, `drift.fixed` |
/// | `LEASEHOLD_KEY_PREFIX` | `key_prefix` |
/// | `LEASEHOLD_REQUIRE` | `require` |
///
/// A bad value is an error naming the variable. Other `LEASEHOLD_*` variables are not
/// configuration keys (test harnesses use the namespace too) and are ignored.
///
/// # Secrets
///
/// `Debug`, `Display` and every error show URLs with the password replaced by `***`, and never
/// the `[backend]` password.
#[derive(Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct LockConfig {
    /// The backend's URL: `memory://`, `redis://…`, `redlock://h1,h2,h3`, `postgres://…`,
    /// `etcd://…`.
    #[serde(default)]
    pub url: Option<String>,
    /// Redlock: one `redis://` URL per node (at least 3).
    #[serde(default)]
    pub urls: Option<Vec<String>>,
    /// The backend in table form.
    #[serde(default)]
    pub backend: Option<BackendTable>,
    /// Lease duration (default 30 s).
    #[serde(default, with = "humantime_serde")]
    pub ttl: Option<Duration>,
    /// Wait budget for acquisitions that wait (default 10 s); see [`wait_budget`](Self::wait_budget).
    #[serde(default, with = "humantime_serde")]
    pub wait: Option<Duration>,
    /// Retry backoff.
    #[serde(default)]
    pub backoff: Option<BackoffConfig>,
    /// Automatic renewal (default `auto`).
    #[serde(default)]
    pub renewal: Option<RenewalSetting>,
    /// Drift margin.
    #[serde(default)]
    pub drift: Option<DriftConfig>,
    /// Key prefix, passed to the driver (each driver has its own default). The memory backend,
    /// being private to the process, has no prefix and ignores it.
    #[serde(default)]
    pub key_prefix: Option<String>,
    /// Efficiency (default) or correctness.
    #[serde(default)]
    pub require: Require,
}

/// The default wait budget: 10 s.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidConfig, CONFIG, msg)
}

/// Which form names the backend.
enum Source<'a> {
    Url(&'a str),
    Nodes(&'a [String]),
    Table(String),
}

impl LockConfig {
    /// A configuration for this backend URL, everything else default.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: Some(url.into()),
            ..Self::default()
        }
    }

    /// Sets the lease duration.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Sets the wait budget.
    pub fn with_wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Sets the renewal policy.
    pub fn with_renewal(mut self, renewal: RenewalSetting) -> Self {
        self.renewal = Some(renewal);
        self
    }

    /// Sets the key prefix.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = Some(prefix.into());
        self
    }

    /// Sets the requirement.
    pub fn with_require(mut self, require: Require) -> Self {
        self.require = require;
        self
    }

    /// Parses TOML and checks every value (no I/O). Environment variables are not read: see
    /// [`with_env`](Self::with_env).
    pub fn from_toml_str(text: &str) -> Result<Self, Error> {
        let cfg: Self = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads a TOML file, then applies the `LEASEHOLD_*` environment variables, and checks the
    /// result.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| {
            invalid(format!(
                "cannot read the configuration file {}: {e}",
                path.display()
            ))
        })?;
        let cfg: Self = toml::from_str(&text).map_err(|e| {
            let e = toml_error(&text, &e);
            invalid(format!("{}: {}", path.display(), e.message()))
        })?;
        cfg.with_env()
    }

    /// The defaults overridden by the `LEASEHOLD_*` environment variables, checked.
    pub fn from_env() -> Result<Self, Error> {
        Self::default().with_env()
    }

    /// Applies the `LEASEHOLD_*` variables of the process environment (see the table in the
    /// type's documentation) and checks the result.
    pub fn with_env(self) -> Result<Self, Error> {
        let mut vars = Vec::new();
        for (k, v) in std::env::vars_os() {
            let Some(k) = k.to_str() else { continue };
            if !k.starts_with("LEASEHOLD_") {
                continue;
            }
            match v.into_string() {
                Ok(v) => vars.push((k.to_owned(), v)),
                Err(_) if ENV_VARS.contains(&k) => {
                    return Err(invalid(format!("{k}: the value is not valid UTF-8")));
                }
                Err(_) => {}
            }
        }
        self.with_vars(vars)
    }

    /// Applies `LEASEHOLD_*` variables given as pairs (as [`with_env`](Self::with_env) does with
    /// the process environment) and checks the result.
    pub fn with_vars<I, K, V>(mut self, vars: I) -> Result<Self, Error>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        for (k, v) in vars {
            self.apply_var(k.as_ref(), v.as_ref())?;
        }
        self.validate()?;
        Ok(self)
    }

    fn apply_var(&mut self, key: &str, value: &str) -> Result<(), Error> {
        let dur = || {
            humantime::parse_duration(value.trim())
                .map_err(|e| invalid(format!("{key}: expected a duration like \"30s\": {e}")))
        };
        match key {
            "LEASEHOLD_URL" => {
                self.url = Some(value.to_owned());
                self.urls = None;
                self.backend = None;
            }
            "LEASEHOLD_URLS" => {
                self.urls = Some(
                    value
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect(),
                );
                self.url = None;
                self.backend = None;
            }
            "LEASEHOLD_BACKEND_USER" | "LEASEHOLD_BACKEND_PASSWORD" => {
                let Some(table) = self.backend.as_mut() else {
                    return Err(invalid(format!(
                        "{key} is set but the configuration has no [backend] table"
                    )));
                };
                if key.ends_with("USER") {
                    table.user = Some(value.to_owned());
                } else {
                    table.password = Some(value.to_owned());
                }
            }
            "LEASEHOLD_TTL" => self.ttl = Some(dur()?),
            "LEASEHOLD_WAIT" => self.wait = Some(dur()?),
            "LEASEHOLD_BACKOFF_INITIAL" => {
                self.backoff.get_or_insert_default().initial = Some(dur()?);
            }
            "LEASEHOLD_BACKOFF_MAX" => self.backoff.get_or_insert_default().max = Some(dur()?),
            "LEASEHOLD_RENEWAL" => {
                self.renewal =
                    Some(RenewalSetting::parse(value).map_err(|e| invalid(format!("{key}: {e}")))?);
            }
            "LEASEHOLD_DRIFT_FACTOR" => {
                let f: f64 = value
                    .trim()
                    .parse()
                    .map_err(|e| invalid(format!("{key}: expected a number like 0.01: {e}")))?;
                self.drift.get_or_insert_default().factor = Some(f);
            }
            "LEASEHOLD_DRIFT_FIXED" => self.drift.get_or_insert_default().fixed = Some(dur()?),
            "LEASEHOLD_KEY_PREFIX" => self.key_prefix = Some(value.to_owned()),
            "LEASEHOLD_REQUIRE" => {
                self.require = match value.trim() {
                    "efficiency" => Require::Efficiency,
                    "correctness" => Require::Correctness,
                    other => {
                        return Err(invalid(format!(
                            "{key}: expected \"efficiency\" or \"correctness\", got {other:?}"
                        )));
                    }
                };
            }
            _ => {}
        }
        Ok(())
    }

    fn source(&self) -> Result<(Source<'_>, &'static str), Error> {
        match (&self.url, &self.urls, &self.backend) {
            (Some(url), None, None) => Ok((Source::Url(url), "url")),
            (None, Some(nodes), None) => Ok((Source::Nodes(nodes), "urls")),
            (None, None, Some(t)) => {
                if t.scheme.is_empty() {
                    return Err(invalid("`backend.scheme`: must not be empty"));
                }
                Ok((Source::Table(t.to_url()), "backend"))
            }
            (None, None, None) => Err(invalid(
                "no backend: set `url` (for example url = \"memory://\" for in-process locks, \
                 or \"redis://127.0.0.1:6379\"), `urls` (Redlock nodes) or a [backend] table",
            )),
            _ => Err(invalid(
                "`url`, `urls` and [backend] are alternatives: give exactly one",
            )),
        }
    }

    /// The lock options this configuration sets (defaults for the rest). The TTL range and
    /// renewal interval are checked against the backend by [`build`](Self::build).
    pub fn lock_options(&self) -> LockOptions {
        let defaults = LockOptions::default();
        let mut backoff = defaults.backoff;
        if let Some(b) = self.backoff {
            backoff = Backoff {
                initial: b.initial.unwrap_or(backoff.initial),
                max: b.max.unwrap_or(backoff.max),
            };
        }
        let mut drift = defaults.drift;
        if let Some(d) = self.drift {
            drift = Drift {
                factor: d.factor.unwrap_or(drift.factor),
                fixed: d.fixed.unwrap_or(drift.fixed),
            };
        }
        let ttl = self.ttl.unwrap_or(defaults.ttl);
        defaults
            .with_ttl(ttl)
            .with_renewal(self.renewal.map_or(Renewal::Auto, RenewalSetting::to_core))
            .with_backoff(backoff)
            .with_drift(drift)
    }

    /// The wait budget for acquisitions that wait (default [`DEFAULT_WAIT`]).
    ///
    /// [`Locker`] has no default wait, so pass it to
    /// [`Locker::acquire`](leasehold_core::Locker::acquire) yourself; `LockLayer` in wait mode
    /// takes it too.
    pub fn wait_budget(&self) -> Duration {
        self.wait.unwrap_or(DEFAULT_WAIT)
    }

    /// Checks every value without connecting to anything: the backend form, the URL and its
    /// scheme (including that its feature is compiled in), the Redlock node count, durations.
    pub fn validate(&self) -> Result<(), Error> {
        if self.ttl.is_some_and(|t| t.is_zero()) {
            return Err(invalid("`ttl`: must be positive, got 0"));
        }
        if let Some(RenewalSetting::Every(d)) = self.renewal
            && d.is_zero()
        {
            return Err(invalid("`renewal`: the interval must be positive, got 0"));
        }
        if let Some(d) = self.drift
            && let Some(f) = d.factor
            && !(f.is_finite() && (0.0..1.0).contains(&f))
        {
            return Err(invalid(format!(
                "`drift.factor`: must be in [0, 1), got {f}"
            )));
        }
        if self.backoff.is_some() {
            let o = self.lock_options().backoff;
            if o.max < o.initial {
                return Err(invalid(format!(
                    "`backoff.max` ({:?}) is below `backoff.initial` ({:?})",
                    o.max, o.initial
                )));
            }
        }
        if let Some(p) = &self.key_prefix
            && p.contains('\0')
        {
            return Err(invalid("`key_prefix`: must not contain a NUL byte"));
        }
        // Parsing the backend does no I/O: the returned future is dropped unpolled.
        drop(self.opening()?);
        Ok(())
    }

    fn opening(&self) -> Result<crate::registry::Opening, Error> {
        let (source, field) = self.source()?;
        let options = self.lock_options();
        let (url, nodes): (String, &[String]) = match &source {
            Source::Url(u) => ((*u).to_owned(), &[]),
            Source::Table(u) => (u.clone(), &[]),
            Source::Nodes(n) => {
                if n.is_empty() {
                    return Err(invalid("`urls`: no Redlock node given"));
                }
                for u in n.iter() {
                    let scheme = scheme_of("urls", u)?;
                    if scheme != "redis" {
                        return Err(invalid(format!(
                            "`urls`: each Redlock node is a redis:// URL, got {:?}",
                            redact(u)
                        )));
                    }
                }
                (String::new(), *n)
            }
        };
        let scheme = if nodes.is_empty() {
            scheme_of(field, &url)?
        } else {
            "redlock"
        };
        let target = Target {
            field,
            url: &url,
            nodes,
            prefix: self.key_prefix.as_deref(),
            drift: options.drift,
        };
        open(scheme, &target)
    }

    /// Opens the backend and returns a [`Locker`] with this configuration's options.
    ///
    /// Fails, before any lock is taken, if a value is wrong, if the backend cannot be reached,
    /// or if `require = "correctness"` and the backend cannot give consensus-grade safety with
    /// monotonic fencing tokens (the error says what it lacks, from
    /// [`Capabilities::correctness_gap`](leasehold_core::Capabilities::correctness_gap)).
    pub async fn build(&self) -> Result<Locker, Error> {
        self.validate()?;
        let backend = self.opening()?.await?;
        if self.require == Require::Correctness
            && let Some(gap) = backend.capabilities().correctness_gap()
        {
            return Err(invalid(format!(
                "`require = \"correctness\"`: the {} backend cannot serve correctness locks: {gap}",
                backend.name()
            )));
        }
        Locker::from_arc(backend).with_options(self.lock_options())
    }

    fn redacted_backend(&self) -> String {
        match (&self.url, &self.urls, &self.backend) {
            (Some(u), _, _) => redact(u),
            (None, Some(n), _) => {
                let n: Vec<String> = n.iter().map(|u| redact(u)).collect();
                format!("[{}]", n.join(", "))
            }
            (None, None, Some(t)) => t.redacted_url(),
            (None, None, None) => "(none)".to_owned(),
        }
    }
}

/// Every environment variable [`LockConfig::with_env`] reads.
pub const ENV_VARS: &[&str] = &[
    "LEASEHOLD_URL",
    "LEASEHOLD_URLS",
    "LEASEHOLD_BACKEND_USER",
    "LEASEHOLD_BACKEND_PASSWORD",
    "LEASEHOLD_TTL",
    "LEASEHOLD_WAIT",
    "LEASEHOLD_BACKOFF_INITIAL",
    "LEASEHOLD_BACKOFF_MAX",
    "LEASEHOLD_RENEWAL",
    "LEASEHOLD_DRIFT_FACTOR",
    "LEASEHOLD_DRIFT_FIXED",
    "LEASEHOLD_KEY_PREFIX",
    "LEASEHOLD_REQUIRE",
];

impl fmt::Debug for LockConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls = self
            .urls
            .as_ref()
            .map(|n| n.iter().map(|u| redact(u)).collect::<Vec<_>>());
        f.debug_struct("LockConfig")
            .field("url", &self.url.as_deref().map(redact))
            .field("urls", &urls)
            .field("backend", &self.backend)
            .field("ttl", &self.ttl)
            .field("wait", &self.wait)
            .field("backoff", &self.backoff)
            .field("renewal", &self.renewal)
            .field("drift", &self.drift)
            .field("key_prefix", &self.key_prefix)
            .field("require", &self.require)
            .finish()
    }
}

impl fmt::Display for LockConfig {
    /// One line: backend (password redacted), TTL, wait budget, requirement.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = self.lock_options();
        write!(
            f,
            "backend {}, ttl {}, wait {}, require {}",
            self.redacted_backend(),
            humantime::format_duration(o.ttl),
            humantime::format_duration(self.wait_budget()),
            self.require
        )
    }
}

/// Turns a TOML error into an error naming the key and line, without quoting the source text
/// (which may hold a password).
fn toml_error(text: &str, e: &toml::de::Error) -> Error {
    let mut msg = redact(e.message());
    if let Some(span) = e.span() {
        let start = span.start.min(text.len());
        let line_no = text[..start].matches('\n').count() + 1;
        let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
        let line = text[line_start..].lines().next().unwrap_or("");
        let key = line
            .split_once('=')
            .map(|(k, _)| k.trim())
            .filter(|k| !k.is_empty() && !k.starts_with('#'));
        msg = match key {
            Some(k) => format!("line {line_no}, `{}`: {msg}", redact(k)),
            None => format!("line {line_no}: {msg}"),
        };
    }
    invalid(msg)
}
