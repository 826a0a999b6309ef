//! The driver table: what every driver crate exports so that a registry (the `leasehold`
//! facade) opens its backends from a URL without a constructor of its own per driver, as
//! sqlx's `AnyDriver` and opendal's service registry do.
//!
//! A driver crate exports one `pub static DRIVER: Driver`: its name, the URL schemes it opens,
//! and a function that parses a [`Target`] (no I/O, so a configuration can be checked without
//! connecting) and returns the [`Opening`] future that connects.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::{Drift, Error, LockBackend};

/// A backend being opened: parsing is done, what is left is I/O (connecting, checking).
pub type Opening =
    Pin<Box<dyn Future<Output = Result<Arc<dyn LockBackend>, Error>> + Send + 'static>>;

/// What a driver is asked to open: a URL, or one URL per node for a driver over several
/// independent nodes, and the settings a configuration gives every backend.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Target<'a> {
    /// The URL (`scheme://…`); empty when [`nodes`](Self::nodes) is used.
    pub url: &'a str,
    /// One URL per node, for a driver over independent nodes (Redlock); empty otherwise.
    pub nodes: &'a [String],
    /// The key prefix, if configured (each driver has its own default).
    pub prefix: Option<&'a str>,
    /// The drift margin, for drivers that use it in their own decisions (Redlock's validity).
    pub drift: Drift,
}

impl<'a> Target<'a> {
    /// A URL, with the driver's default prefix and the default drift.
    pub fn url(url: &'a str) -> Self {
        Self {
            url,
            nodes: &[],
            prefix: None,
            drift: Drift::default(),
        }
    }

    /// One URL per node, with the driver's default prefix and the default drift.
    pub fn nodes(nodes: &'a [String]) -> Self {
        Self {
            nodes,
            ..Self::url("")
        }
    }

    /// Sets the key prefix (`None`: the driver's default).
    pub fn with_prefix(mut self, prefix: Option<&'a str>) -> Self {
        self.prefix = prefix;
        self
    }

    /// Sets the drift margin.
    pub fn with_drift(mut self, drift: Drift) -> Self {
        self.drift = drift;
        self
    }

    /// `config` with the configured prefix set by `with_prefix`, or as it is if none is.
    pub fn prefixed<C>(
        &self,
        config: C,
        with_prefix: impl FnOnce(C, &str) -> Result<C, Error>,
    ) -> Result<C, Error> {
        match self.prefix {
            Some(prefix) => with_prefix(config, prefix),
            None => Ok(config),
        }
    }

    /// The scheme of the URL (the text before `://`), if it has one.
    pub fn scheme(&self) -> Option<&'a str> {
        self.url
            .split_once("://")
            .map(|(scheme, _)| scheme)
            .filter(|s| !s.is_empty())
    }
}

/// One driver's entry in a registry.
#[derive(Debug)]
pub struct Driver {
    /// The driver's name (`"redis"`, `"postgres"`, …).
    pub name: &'static str,
    /// The URL schemes it opens, as this build compiled it.
    pub schemes: &'static [&'static str],
    /// Parses the target (configuration errors only, no I/O) and returns the future that
    /// opens the backend.
    pub open: fn(&Target<'_>) -> Result<Opening, Error>,
}

impl Driver {
    /// The entry of a driver called `name` that opens `schemes` with `open`.
    pub const fn new(
        name: &'static str,
        schemes: &'static [&'static str],
        open: fn(&Target<'_>) -> Result<Opening, Error>,
    ) -> Self {
        Self {
            name,
            schemes,
            open,
        }
    }

    /// Whether this driver opens `scheme`.
    pub fn opens(&self, scheme: &str) -> bool {
        self.schemes.contains(&scheme)
    }
}

/// Boxes a backend's connecting future (`Backend::connect(config)`) as an [`Opening`].
pub fn connecting<B, F>(connect: F) -> Opening
where
    B: LockBackend + 'static,
    F: Future<Output = Result<B, Error>> + Send + 'static,
{
    Box::pin(async move { Ok(Arc::new(connect.await?) as Arc<dyn LockBackend>) })
}

/// Boxes a backend made without I/O as an [`Opening`] that is ready at once.
pub fn ready<B: LockBackend + 'static>(backend: B) -> Opening {
    Box::pin(std::future::ready(Ok(
        Arc::new(backend) as Arc<dyn LockBackend>
    )))
}

/// The in-memory backend's entry: `memory://`, exactly (no host, path or options).
pub static MEMORY: Driver = Driver::new("memory", &["memory"], open_memory);

fn open_memory(t: &Target<'_>) -> Result<Opening, Error> {
    if t.url != "memory://" {
        return Err(Error::new(
            crate::ErrorKind::InvalidConfig,
            "memory",
            "the memory backend's URL is exactly memory:// (no host, path or options)",
        ));
    }
    Ok(ready(crate::MemoryBackend::new()))
}
