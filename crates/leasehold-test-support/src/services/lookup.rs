//! Finding a service and checking that it answers; the skip-or-fail policy of tests.

use std::fmt;
use std::io::{self, Write as _};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::env::{ALLOW_SKIP_VAR, config, env_file, may_skip};
use super::kind::Service;
use super::pg_socket::lookup_pg_socket;

/// How long a service's port gets to accept a connection before the service
/// counts as missing.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The addresses of an available service, as returned by [`require`] and
/// [`lookup`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    service: Service,
    raw: String,
    urls: Vec<String>,
    addrs: Vec<SocketAddr>,
}

impl Endpoints {
    /// The service these endpoints belong to.
    pub fn service(&self) -> Service {
        self.service
    }

    /// The variable's value exactly as configured (for
    /// [`Service::PostgresSocket`]: the socket directory).
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The first (for single-server services: the only) URL or endpoint.
    pub fn url(&self) -> &str {
        // `lookup` never builds an `Endpoints` without at least one URL.
        self.urls.first().map_or("", String::as_str)
    }

    /// Every URL or endpoint, in configured order (five for
    /// [`Service::Redlock`], three for [`Service::EtcdCluster`]).
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The TCP address of the first endpoint, e.g. to put a
    /// [`FaultProxy`](crate::proxy::FaultProxy) in front of it. `None` only
    /// for [`Service::PostgresSocket`].
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addrs.first().copied()
    }

    /// The TCP addresses of every endpoint, in configured order (empty for
    /// [`Service::PostgresSocket`]).
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }
}

/// Why a service counts as missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// The service that is missing.
    pub service: Service,
    /// What went wrong, for humans.
    pub reason: String,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} not available: {}", self.service, self.reason)
    }
}

impl std::error::Error for Unavailable {}

/// Finds `service` and checks that it answers, without applying the skip/fail
/// policy (see [`require`] for that).
pub fn lookup(service: Service) -> Result<Endpoints, Unavailable> {
    let unavailable = |reason: String| Unavailable { service, reason };
    let cfg = config();
    let raw = cfg
        .get(service.env_key())
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            unavailable(format!(
                "{} is not set (env file {})",
                service.env_key(),
                env_file().display()
            ))
        })?;

    if service == Service::PostgresSocket {
        let conninfo = lookup_pg_socket(
            &raw,
            cfg.get(Service::Postgres.env_key()).map(String::as_str),
        )
        .map_err(unavailable)?;
        return Ok(Endpoints {
            service,
            raw,
            urls: vec![conninfo],
            addrs: Vec::new(),
        });
    }

    // Blank entries (a trailing comma) are ignored.
    let urls: Vec<String> = raw.split(',').filter_map(trimmed).collect();
    if urls.is_empty() {
        return Err(unavailable(format!("{} is empty", service.env_key())));
    }
    let mut addrs = Vec::with_capacity(urls.len());
    for url in &urls {
        let hostport = host_port(url, service.default_port());
        let addr = hostport
            .to_socket_addrs()
            .ok()
            .and_then(|mut it| it.next())
            .ok_or_else(|| unavailable(format!("cannot resolve {hostport:?} (from {url:?})")))?;
        addrs.push(addr);
    }
    probe_all(&addrs).map_err(unavailable)?;
    Ok(Endpoints {
        service,
        raw,
        urls,
        addrs,
    })
}

/// The policy for tests: returns the service's endpoints when it is
/// available; otherwise panics, unless skipping is explicitly allowed (see
/// [`may_skip`]: `LEASEHOLD_ALLOW_SKIP=1` outside CI), and then writes
/// `SKIPPED: <service> not available (run scripts/services up)` to stderr and
/// returns `None` so the test can return early. See [`require_service!`](crate::require_service).
pub fn require(service: Service) -> Option<Endpoints> {
    match lookup(service) {
        Ok(endpoints) => Some(endpoints),
        Err(err) => {
            let test = std::thread::current()
                .name()
                .map(|n| format!(" in test `{n}`"))
                .unwrap_or_default();
            if !may_skip() {
                panic!(
                    "{service} not available{test}: {}; run `scripts/services up` before the \
                     tests (or set {ALLOW_SKIP_VAR}=1, outside CI, to skip tests whose \
                     service is missing)",
                    err.reason
                );
            }
            // Written to the real stderr, not via `eprintln!`, which libtest
            // captures and shows only for failing tests.
            let _ = writeln!(
                io::stderr().lock(),
                "SKIPPED: {service} not available (run scripts/services up){test}: {}",
                err.reason
            );
            None
        }
    }
}

/// `entry` without surrounding blanks, unless nothing is left.
fn trimmed(entry: &str) -> Option<String> {
    Some(entry.trim())
        .filter(|e| !e.is_empty())
        .map(str::to_owned)
}

/// `scheme://user:pass@host:port/path?query` (or plain `host:port`) to
/// `host:port`, adding `default_port` when there is none.
fn host_port(url: &str, default_port: u16) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let has_port = if let Some(v6) = rest.strip_prefix('[') {
        v6.split_once(']').is_some_and(|(_, p)| p.starts_with(':'))
    } else {
        rest.contains(':')
    };
    if has_port {
        rest.to_owned()
    } else {
        format!("{rest}:{default_port}")
    }
}

/// Probes every address concurrently; the first failure is the error.
fn probe_all(addrs: &[SocketAddr]) -> Result<(), String> {
    std::thread::scope(|scope| {
        let probes: Vec<_> = addrs
            .iter()
            .map(|addr| {
                scope.spawn(move || {
                    TcpStream::connect_timeout(addr, PROBE_TIMEOUT)
                        .map(drop)
                        .map_err(|e| format!("nothing accepts connections on {addr}: {e}"))
                })
            })
            .collect();
        probes
            .into_iter()
            .map(|probe| {
                probe
                    .join()
                    .unwrap_or_else(|_| Err("connection probe panicked".to_owned()))
            })
            .collect::<Result<Vec<()>, String>>()
            .map(drop)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_host_and_port() {
        assert_eq!(
            host_port("redis://127.0.0.1:17400", 6379),
            "127.0.0.1:17400"
        );
        assert_eq!(host_port("redis://127.0.0.1/0", 6379), "127.0.0.1:6379");
        assert_eq!(
            host_port("postgres://u:p@127.0.0.1:17432/db?x=1", 5432),
            "127.0.0.1:17432"
        );
        assert_eq!(host_port("127.0.0.1:17479", 2379), "127.0.0.1:17479");
        assert_eq!(host_port("http://[::1]:2379", 2379), "[::1]:2379");
        assert_eq!(host_port("[::1]", 2379), "[::1]:2379");
    }
}
