//! The scheme registry: it chains the driver tables this build compiles in (each driver
//! crate's `DRIVER`) and finds the one that opens a URL's scheme.

use std::sync::Arc;

use leasehold_core::driver::{self, Driver, Opening, Target};
use leasehold_core::redact;
use leasehold_core::{Error, ErrorKind, LockBackend};

/// Name used as the backend of configuration errors.
pub(crate) const CONFIG: &str = "config";

/// The drivers compiled in, in registry order, each with the facade feature that compiles it
/// in (`""` for the memory backend, which needs none).
static DRIVERS: &[(&Driver, &str)] = &[
    (&driver::MEMORY, ""),
    #[cfg(all(feature = "file", unix))]
    (&leasehold_file::DRIVER, "file"),
    #[cfg(feature = "redis")]
    (&leasehold_redis::DRIVER, "redis"),
    #[cfg(feature = "postgres")]
    (&leasehold_postgres::DRIVER, "postgres"),
    #[cfg(feature = "etcd")]
    (&leasehold_etcd::DRIVER, "etcd"),
];

/// The schemes of the drivers this build lacks (space-separated), with the facade feature
/// that adds each: only for saying which feature to turn on, since a driver that is not
/// compiled in has no table to ask. Each entry exists only while its driver is out of the
/// build.
static MISSING: &[(&str, &str)] = &[
    #[cfg(not(all(feature = "file", unix)))]
    ("file", "file"),
    #[cfg(not(feature = "redis"))]
    (
        "redis",
        "redis rediss redis+unix unix redis-cluster redis+sentinel rediss+sentinel redlock",
    ),
    #[cfg(not(feature = "postgres"))]
    ("postgres", "postgres postgresql"),
    #[cfg(not(feature = "etcd"))]
    ("etcd", "etcd"),
    #[cfg(not(feature = "etcd-tls"))]
    ("etcd-tls", "etcds"),
];

fn driver_of(scheme: &str) -> Option<&'static Driver> {
    DRIVERS.iter().map(|(d, _)| *d).find(|d| d.opens(scheme))
}

/// The URL schemes this build can open, in registry order.
///
/// `memory` is always there, `file` with the default feature `file` (on Unix); the others
/// come with the crate features `redis`, `postgres`, `etcd` and `etcd-tls`.
pub fn available_schemes() -> Vec<&'static str> {
    DRIVERS
        .iter()
        .flat_map(|(d, _)| d.schemes.iter().copied())
        .collect()
}

/// The crate feature that compiles in `scheme`, if leasehold knows the scheme at all
/// (`Some("")` for `memory`, which needs none).
pub fn scheme_feature(scheme: &str) -> Option<&'static str> {
    let missing = MISSING
        .iter()
        .find(|(_, schemes)| schemes.split(' ').any(|s| s == scheme));
    let compiled = DRIVERS.iter().find(|(d, _)| d.opens(scheme));
    missing
        .map(|(feature, _)| *feature)
        .or(compiled.map(|(_, feature)| *feature))
}

/// Opens the backend of a URL with default settings: `memory://`, `redis://…`,
/// `postgres://…`, `etcd://…` and so on (see [`available_schemes`]). For TTLs, prefixes and
/// the correctness requirement, use [`LockConfig`](crate::LockConfig).
pub async fn connect(url: &str) -> Result<Arc<dyn LockBackend>, Error> {
    open("url", scheme_of("url", url)?, &Target::url(url))?.await
}

/// The scheme of `url` (the text before `://`).
pub(crate) fn scheme_of<'u>(field: &str, url: &'u str) -> Result<&'u str, Error> {
    Target::url(url).scheme().ok_or_else(|| {
        Error::new(
            ErrorKind::InvalidConfig,
            CONFIG,
            // The value is not quoted: without `://` there is no telling where a password is.
            format!(
                "`{field}`: not a URL: expected scheme://…, with a scheme among {}",
                available_schemes().join(", ")
            ),
        )
    })
}

/// Finds the driver of `scheme` and has it parse the target (the configuration `field` it
/// came from names its errors); the returned future does the I/O.
pub(crate) fn open(field: &str, scheme: &str, target: &Target<'_>) -> Result<Opening, Error> {
    if let Some(driver) = driver_of(scheme) {
        return (driver.open)(target).map_err(|e| at_field(field, e));
    }
    let available = available_schemes().join(", ");
    let msg = match scheme_feature(scheme) {
        Some(feature) => format!(
            "`{field}`: scheme {scheme:?} needs the `{feature}` feature of the leasehold crate, \
             which is not compiled in; available schemes: {available}"
        ),
        None => {
            let missing: Vec<String> = MISSING
                .iter()
                .flat_map(|(f, schemes)| {
                    schemes
                        .split(' ')
                        .map(move |s| format!("{s} (feature `{f}`)"))
                })
                .collect();
            let mut msg = format!(
                "`{field}`: unknown scheme {:?}; available schemes: {available}",
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

/// Re-labels a driver's parse error with the configuration field it came from. The driver's
/// error is not kept as the source: its message, unredacted, would show in `Debug`.
fn at_field(field: &str, e: Error) -> Error {
    let msg = format!("`{field}`: {}", redact(e.message()));
    Error::new(e.kind(), e.backend().to_owned(), msg).with_retryable(e.is_retryable())
}

/// Refuses a URL whose password holds `/ ? # @` unencoded, whatever its driver: a URL parser
/// would read a piece of it as the host (and look it up, and name it in errors). Nothing of
/// the URL is quoted.
pub(crate) fn check_encoded(field: &str, url: &str) -> Result<(), Error> {
    leasehold_core::redaction::refuse_unencoded_userinfo(CONFIG, url)
        .map_err(|e| at_field(field, e))
}

/// The invalid-configuration error of the facade.
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidConfig, CONFIG, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_compiled_scheme_has_its_feature_and_one_driver() {
        for s in available_schemes() {
            assert!(scheme_feature(s).is_some(), "{s} has no feature");
            let drivers = DRIVERS.iter().filter(|(d, _)| d.opens(s)).count();
            assert_eq!(drivers, 1, "{s} is opened by {drivers} drivers");
        }
        assert!(available_schemes().contains(&"memory"));
        assert_eq!(scheme_feature("memory"), Some(""));
        assert_eq!(scheme_feature("zookeeper"), None);
    }
}
