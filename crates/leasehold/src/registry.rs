//! The scheme registry: which URL schemes this build can open, and how.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use leasehold_core::{Drift, Error, ErrorKind, LockBackend, MemoryBackend};

use crate::redact::redact;

/// Name used as the backend of configuration errors.
pub(crate) const CONFIG: &str = "config";

/// A backend being opened: parsing is done, what is left is I/O (connecting, checking).
pub(crate) type Opening =
    Pin<Box<dyn Future<Output = Result<Arc<dyn LockBackend>, Error>> + Send + 'static>>;

/// What a constructor is given.
// Only the drivers read the prefix, and only Redlock the nodes and drift.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) struct Target<'a> {
    /// The configuration field the URL came from, for error messages.
    pub(crate) field: &'static str,
    /// The URL (`scheme://…`); empty when `nodes` is used.
    pub(crate) url: &'a str,
    /// Redlock nodes given as a list of `redis://` URLs.
    pub(crate) nodes: &'a [String],
    /// The key prefix, if configured.
    pub(crate) prefix: Option<&'a str>,
    /// The drift margin, for backends that use it in their own decisions (Redlock).
    pub(crate) drift: Drift,
}

/// Parses the target and returns the future that opens the backend. Errors here are
/// configuration errors, raised without any I/O.
type Ctor = fn(&Target<'_>) -> Result<Opening, Error>;

/// Every scheme leasehold knows, with the facade feature that compiles it in.
pub(crate) const KNOWN: &[(&str, &str)] = &[
    ("memory", ""),
    ("file", ""),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redis+unix", "redis"),
    ("unix", "redis"),
    ("redis-cluster", "redis"),
    ("redlock", "redis"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("etcd", "etcd"),
    ("etcds", "etcd-tls"),
];

fn entries() -> Vec<(&'static str, Ctor)> {
    #[allow(unused_mut)] // nothing is added without driver features
    let mut v: Vec<(&'static str, Ctor)> = vec![("memory", memory), ("file", file)];
    #[cfg(feature = "redis")]
    {
        v.extend(
            leasehold_redis::SCHEMES
                .iter()
                .map(|s| (*s, drivers::redis as Ctor)),
        );
        v.extend(
            leasehold_redis::REDLOCK_SCHEMES
                .iter()
                .map(|s| (*s, drivers::redlock as Ctor)),
        );
    }
    #[cfg(feature = "postgres")]
    v.extend(
        leasehold_postgres::SCHEMES
            .iter()
            .map(|s| (*s, drivers::postgres as Ctor)),
    );
    #[cfg(feature = "etcd")]
    v.extend(
        leasehold_etcd::SCHEMES
            .iter()
            .filter(|s| cfg!(feature = "etcd-tls") || **s != "etcds")
            .map(|s| (*s, drivers::etcd as Ctor)),
    );
    v
}

/// The URL schemes this build can open, in registry order.
///
/// `memory` and `file` are always there; the others come with the crate features `redis`, `postgres`,
/// `etcd` and `etcd-tls`.
pub fn available_schemes() -> Vec<&'static str> {
    entries().into_iter().map(|(s, _)| s).collect()
}

/// The crate feature that compiles in `scheme`, if leasehold knows the scheme at all
/// (`Some("")` for `memory`, which needs none).
pub fn scheme_feature(scheme: &str) -> Option<&'static str> {
    KNOWN.iter().find(|(s, _)| *s == scheme).map(|(_, f)| *f)
}

/// Opens the backend of a URL with default settings: `memory://`, `redis://…`,
/// `postgres://…`, `etcd://…` and so on (see [`available_schemes`]). For TTLs, prefixes and
/// the correctness requirement, use [`LockConfig`](crate::LockConfig).
pub async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, Error> {
    let target = Target {
        field: "url",
        url,
        nodes: &[],
        prefix: None,
        drift: Drift::default(),
    };
    open(scheme_of("url", url)?, &target)?.await
}

/// The scheme of `url` (the text before `://`).
pub(crate) fn scheme_of<'u>(field: &str, url: &'u str) -> Result<&'u str, Error> {
    match url.split_once("://") {
        Some((scheme, _)) if !scheme.is_empty() => Ok(scheme),
        _ => Err(Error::new(
            ErrorKind::InvalidConfig,
            CONFIG,
            // The value is not quoted: without `://` there is no telling where a password is.
            format!(
                "`{field}`: not a URL: expected scheme://…, with a scheme among {}",
                available_schemes().join(", ")
            ),
        )),
    }
}

/// Finds the constructor of `scheme` and parses the target; the returned future does the I/O.
pub(crate) fn open(scheme: &str, target: &Target<'_>) -> Result<Opening, Error> {
    let entries = entries();
    if let Some((_, ctor)) = entries.iter().find(|(s, _)| *s == scheme) {
        return ctor(target).map_err(|e| at_field(target.field, e));
    }
    let available = available_schemes().join(", ");
    let msg = match scheme_feature(scheme) {
        Some(feature) => format!(
            "`{}`: scheme {scheme:?} needs the `{feature}` feature of the leasehold crate, which \
             is not compiled in; available schemes: {available}",
            target.field
        ),
        None => {
            let missing: Vec<String> = KNOWN
                .iter()
                .filter(|(s, _)| !entries.iter().any(|(e, _)| e == s))
                .map(|(s, f)| format!("{s} (feature `{f}`)"))
                .collect();
            let mut msg = format!(
                "`{}`: unknown scheme {:?}; available schemes: {available}",
                target.field,
                redact(scheme)
            );
            if !missing.is_empty() {
                msg.push_str(&format!("; with more features: {}", missing.join(", ")));
            }
            msg
        }
    };
    Err(Error::new(ErrorKind::InvalidConfig, CONFIG, msg))
}

/// Re-labels a driver's parse error with the configuration field it came from.
pub(crate) fn at_field(field: &str, e: Error) -> Error {
    let msg = format!("`{field}`: {}", redact(e.message()));
    Error::new(e.kind(), e.backend().to_owned(), msg)
        .with_retryable(e.is_retryable())
        .with_source(e)
}

fn file(t: &Target<'_>) -> Result<Opening, Error> {
    let config = leasehold_core::FileConfig::from_url(t.url)?;
    Ok(Box::pin(async move {
        let backend = leasehold_core::FileBackend::new(config)?;
        Ok(Arc::new(backend) as Arc<dyn LockBackend>)
    }))
}

fn memory(t: &Target<'_>) -> Result<Opening, Error> {
    if t.url != "memory://" {
        return Err(Error::new(
            ErrorKind::InvalidConfig,
            "memory",
            "the memory backend's URL is exactly memory:// (no host, path or options)",
        ));
    }
    Ok(Box::pin(async {
        Ok(Arc::new(MemoryBackend::new()) as Arc<dyn LockBackend>)
    }))
}

#[cfg(any(feature = "redis", feature = "postgres", feature = "etcd"))]
mod drivers {
    use super::*;

    #[cfg(feature = "redis")]
    pub(super) fn redis(t: &Target<'_>) -> Result<Opening, Error> {
        use leasehold_redis::{RedisBackend, RedisConfig};
        let mut cfg = RedisConfig::from_url(t.url)?;
        if let Some(p) = t.prefix {
            cfg = cfg.with_prefix(p)?;
        }
        Ok(Box::pin(async move {
            Ok(Arc::new(RedisBackend::connect(cfg).await?) as Arc<dyn LockBackend>)
        }))
    }

    #[cfg(feature = "redis")]
    pub(super) fn redlock(t: &Target<'_>) -> Result<Opening, Error> {
        use leasehold_redis::{RedlockBackend, RedlockConfig};
        let mut cfg = if t.nodes.is_empty() {
            RedlockConfig::from_url(t.url)?
        } else {
            RedlockConfig::from_urls(t.nodes)?
        };
        if let Some(p) = t.prefix {
            cfg = cfg.with_prefix(p)?;
        }
        let backend = RedlockBackend::new(cfg.with_drift(t.drift))?;
        Ok(Box::pin(async move {
            Ok(Arc::new(backend) as Arc<dyn LockBackend>)
        }))
    }

    #[cfg(feature = "postgres")]
    pub(super) fn postgres(t: &Target<'_>) -> Result<Opening, Error> {
        use leasehold_postgres::{PostgresBackend, PostgresConfig};
        let mut cfg = PostgresConfig::from_url(t.url)?;
        if let Some(p) = t.prefix {
            cfg = cfg.with_prefix(p)?;
        }
        Ok(Box::pin(async move {
            Ok(Arc::new(PostgresBackend::connect(cfg).await?) as Arc<dyn LockBackend>)
        }))
    }

    #[cfg(feature = "etcd")]
    pub(super) fn etcd(t: &Target<'_>) -> Result<Opening, Error> {
        use leasehold_etcd::{EtcdBackend, EtcdConfig};
        let mut cfg = EtcdConfig::from_url(t.url)?;
        if let Some(p) = t.prefix {
            cfg = cfg.with_prefix(p);
        }
        cfg.validate()?;
        Ok(Box::pin(async move {
            Ok(Arc::new(EtcdBackend::connect(cfg).await?) as Arc<dyn LockBackend>)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_compiled_scheme_is_known_with_its_feature() {
        for s in available_schemes() {
            assert!(scheme_feature(s).is_some(), "{s} missing from KNOWN");
        }
        assert!(available_schemes().contains(&"memory"));
    }
}
