//! The `LEASEHOLD_*` environment variables that override a [`LockConfig`].

use crate::config::{LockConfig, RenewalSetting, Require};
use crate::registry::invalid;
use leasehold_core::Error;

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

impl LockConfig {
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
}
