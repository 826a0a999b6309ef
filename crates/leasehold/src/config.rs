//! `LockConfig`: choosing and tuning a backend by configuration.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use leasehold_core::driver::{Opening, Target};
use leasehold_core::redact;
use std::sync::Arc;

use leasehold_core::{
    Backoff, Drift, Error, LockBackend, LockOptions, Locker, PermitLimit, Renewal, Semaphore,
};
use serde::Deserialize;

use crate::registry::{check_encoded, invalid, open, scheme_of};
use crate::table::BackendTable;
use leasehold_core::LockBackendExt as _;

/// What the locks of a configuration are for: efficiency (a lost lock costs duplicate work) or
/// correctness (a lost lock corrupts data).
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
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
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
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct BackoffConfig {
    /// Upper bound of the first delay (default 10 ms).
    #[serde(with = "humantime_serde")]
    pub initial: Option<Duration>,
    /// Upper bound of every delay (default 500 ms).
    #[serde(with = "humantime_serde")]
    pub max: Option<Duration>,
}

/// The drift margin (`[drift]`): `ttl × factor + fixed`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct DriftConfig {
    /// Proportional part, in `[0, 1)` (default 0.01).
    pub factor: Option<f64>,
    /// Fixed part (default 2 ms).
    #[serde(with = "humantime_serde")]
    pub fixed: Option<Duration>,
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
/// the `[backend]` password (the rules are [`redact`]'s). A URL whose password holds
/// `/ ? # @` unencoded is refused (percent-encode it, or use a `[backend]` table): a URL
/// parser would take part of it for the host name. TOML errors name the line and the key,
/// never the value, which may be a password of the wrong type.
#[derive(Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
#[non_exhaustive]
pub struct LockConfig {
    /// The backend's URL: `memory://`, `redis://…`, `redlock://h1,h2,h3`, `postgres://…`,
    /// `etcd://…`.
    pub url: Option<String>,
    /// Redlock: one `redis://` URL per node (at least 3).
    pub urls: Option<Vec<String>>,
    /// The backend in table form.
    pub backend: Option<BackendTable>,
    /// Lease duration (default 30 s).
    #[serde(with = "humantime_serde")]
    pub ttl: Option<Duration>,
    /// Wait budget for acquisitions that wait (default 10 s); see [`wait_budget`](Self::wait_budget).
    #[serde(with = "humantime_serde")]
    pub wait: Option<Duration>,
    /// Retry backoff.
    pub backoff: Option<BackoffConfig>,
    /// Automatic renewal (default `auto`).
    pub renewal: Option<RenewalSetting>,
    /// Drift margin.
    pub drift: Option<DriftConfig>,
    /// Key prefix, passed to the driver (each driver has its own default). The memory backend,
    /// being private to the process, has no prefix and ignores it.
    pub key_prefix: Option<String>,
    /// Efficiency (default) or correctness.
    pub require: Require,
}

/// The default wait budget: 10 s.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);

/// The scheme a list of node URLs (`urls`) opens: Redlock, whose driver checks the nodes.
const NODES_SCHEME: &str = "redlock";

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
        // Parsing the backend does no I/O: the returned future is dropped unpolled.
        drop(self.opening()?);
        Ok(())
    }

    /// Checks the values other than the backend.
    fn check_values(&self) -> Result<(), Error> {
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
        Ok(())
    }

    /// Checks every value (see [`validate`](Self::validate)) and parses the backend: the
    /// returned future does the I/O. The one place a configuration's URL is parsed.
    fn opening(&self) -> Result<Opening, Error> {
        self.check_values()?;
        let (source, field) = self.source()?;
        let url = match &source {
            Source::Url(u) => (*u).to_owned(),
            Source::Table(u) => u.clone(),
            Source::Nodes(_) => String::new(),
        };
        match &source {
            Source::Url(u) => check_encoded(field, u)?,
            Source::Nodes(nodes) => nodes.iter().try_for_each(|u| check_encoded(field, u))?,
            Source::Table(_) => {} // percent-encoded by the table
        }
        let (scheme, target) = match source {
            Source::Nodes(nodes) => (NODES_SCHEME, Target::nodes(nodes)),
            Source::Url(_) | Source::Table(_) => (scheme_of(field, &url)?, Target::url(&url)),
        };
        let target = target
            .with_prefix(self.key_prefix.as_deref())
            .with_drift(self.lock_options().drift);
        open(field, scheme, &target)
    }

    /// Opens the backend and returns a [`Locker`] with this configuration's options.
    ///
    /// Fails, before any lock is taken, if a value is wrong, if the backend cannot be reached,
    /// or if `require = "correctness"` and the backend cannot give consensus-grade safety with
    /// monotonic fencing tokens (the error says what it lacks, from
    /// [`Capabilities::correctness_gap`](leasehold_core::Capabilities::correctness_gap)).
    pub async fn build(&self) -> Result<Locker, Error> {
        let backend = self.checked_backend().await?;
        Locker::from_arc(backend).with_options(self.lock_options())
    }

    /// Opens the backend and returns an [`Elector`](leasehold_core::Elector) for `key`
    /// publishing `candidate`, with this configuration's options (its TTL is the leadership's).
    ///
    /// Fails as [`build`](Self::build) does (`require = "correctness"` applies to the
    /// election), and with [`ErrorKind::Unsupported`](leasehold_core::ErrorKind::Unsupported)
    /// and the backend's reason when it gives no elections (Redlock).
    pub async fn build_elector(
        &self,
        key: impl leasehold_core::IntoLockKey,
        candidate: leasehold_core::Candidate,
    ) -> Result<leasehold_core::Elector, Error> {
        let backend = self.checked_backend().await?;
        leasehold_core::Elector::new(backend, key, candidate, self.lock_options())
    }

    /// The backend, opened and checked against `require`.
    async fn checked_backend(&self) -> Result<Arc<dyn LockBackend>, Error> {
        let backend = self.opening()?.await?;
        if self.require == Require::Correctness
            && let Some(gap) = backend.capabilities().correctness_gap()
        {
            return Err(invalid(format!(
                "`require = \"correctness\"`: the {} backend cannot serve correctness locks: {gap}",
                backend.name()
            )));
        }
        Ok(backend)
    }

    /// Opens the backend and returns a [`Semaphore`] of `permits` permits per key with this
    /// configuration's options.
    ///
    /// Fails as [`build`](Self::build) does (`require = "correctness"` applies: a permit is as
    /// safe as a lock of its backend), and with
    /// [`ErrorKind::Unsupported`](leasehold_core::ErrorKind::Unsupported) and the backend's
    /// reason when it gives no semaphores (Redlock).
    pub async fn build_semaphore(&self, permits: u32) -> Result<Semaphore, Error> {
        let limit = PermitLimit::new(permits)?;
        let backend = self.checked_backend().await?;
        Semaphore::from_arc(backend, limit)?.with_options(self.lock_options())
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

/// Words a TOML error may quote and still show: names of fields and values of this
/// configuration, and the examples of our own messages.
const SHOWN_WORDS: &[&str] = &[
    "url",
    "urls",
    "backend",
    "ttl",
    "wait",
    "backoff",
    "renewal",
    "drift",
    "key_prefix",
    "require",
    "initial",
    "max",
    "factor",
    "fixed",
    "scheme",
    "hosts",
    "user",
    "password",
    "database",
    "options",
    "efficiency",
    "correctness",
    "off",
    "auto",
    "5s",
    "30s",
];

/// The message of a TOML error without the values it quotes: a value of the wrong type (a
/// password of digits written without quotes, a password in the wrong field) would be shown
/// as it is, where no redaction rule can tell it is a secret. A quoted word stays if it is a
/// name of [`SHOWN_WORDS`] or punctuation (`expected `=``); anything else becomes `…`.
fn without_values(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut rest = msg;
    while let Some(open) = rest.find(['`', '"']) {
        let quote = &rest[open..=open];
        out.push_str(&rest[..=open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find(quote) else {
            out.push('…');
            return out;
        };
        let word = &after[..close];
        if SHOWN_WORDS.contains(&word) || word.chars().all(|c| c.is_ascii_punctuation()) {
            out.push_str(word);
        } else {
            out.push('…');
        }
        out.push_str(quote);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Turns a TOML error into an error naming the key and line, without quoting the source text
/// or any value (either may hold a password).
fn toml_error(text: &str, e: &toml::de::Error) -> Error {
    let mut msg = without_values(&redact(e.message()));
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
            Some(k) => format!("line {line_no}, `{}`: {msg}", without_values(&redact(k))),
            None => format!("line {line_no}: {msg}"),
        };
    }
    invalid(msg)
}
