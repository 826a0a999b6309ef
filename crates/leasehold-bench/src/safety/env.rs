//! Where the servers of the safety table are ([`Env`]), how each client connects to them
//! ([`Spec`]), the TTLs and pauses per backend ([`Timing`]), and proxies in front of them.

use std::path::PathBuf;
use std::time::Duration;

use futures_util::FutureExt as _;
use leasehold_core::{LockOptions, Locker, MemoryBackend};
use leasehold_etcd::{EtcdBackend, EtcdConfig};
use leasehold_postgres::{PostgresBackend, PostgresConfig};
use leasehold_redis::{RedisBackend, RedisConfig, RedlockBackend, RedlockConfig};
use leasehold_test_support::proxy::FaultProxy;
use leasehold_test_support::services::{self, Service};

use crate::file_backend::{FileBackend, FileConfig};
use crate::harness::BoxError;

/// Env variables of the dedicated nodes (written by `scripts/services`).
const SAFETY_URLS_VAR: &str = "LEASEHOLD_TEST_SAFETY_REDIS_URLS";
pub(super) const SAFETY_CLOCK_VAR: &str = "LEASEHOLD_TEST_SAFETY_CLOCK_FILE";
pub(super) const SAFETY_NODES: [&str; 3] = ["safety1", "safety2", "safety3"];
/// Index of the node whose clock moves (safety3).
pub(super) const CLOCK_NODE: usize = 2;
/// Index of the node the restart faults restart (safety2 for Redlock; safety1 serves the
/// single-node backend).
pub(super) const RESTART_NODE: usize = 1;
/// The `application_name` of the trials' PostgreSQL sessions.
pub(super) const SAFETY_APP: &str = "leasehold-bench-safety";
pub(super) const ETCD_CLUSTER_NODES: [&str; 3] = ["etcd-c1", "etcd-c2", "etcd-c3"];

/// Where the servers are, and what every trial of a run shares.
pub(super) struct Env {
    pub(super) tag: String,
    pub(super) safety: Vec<String>,
    pub(super) clock_file: Option<PathBuf>,
    /// The `redis+sentinel://` URL of the Sentinel topology (the failover faults).
    pub(super) sentinel: Option<String>,
    pub(super) postgres: Option<String>,
    pub(super) etcd: Option<Vec<String>>,
    pub(super) etcd_cluster: Option<Vec<String>>,
    pub(super) file_dir: PathBuf,
    pub(super) memory: MemoryBackend,
}

impl Env {
    pub(super) fn load(backends: &[String]) -> Result<Self, BoxError> {
        let want = |b: &str| backends.iter().any(|x| x == b);
        let need = |s: Service| -> Result<Vec<String>, BoxError> {
            services::lookup(s)
                .map_err(|e| format!("{e}; run scripts/services up").into())
                .map(|ep| ep.urls().to_vec())
        };
        let safety: Vec<String> = if want("redis") || want("redlock") {
            let v = services::var(SAFETY_URLS_VAR).ok_or_else(|| {
                format!(
                    "{SAFETY_URLS_VAR} is not set (env file {}): run scripts/services up",
                    services::env_file().display()
                )
            })?;
            v.split(',').map(|s| s.trim().to_owned()).collect()
        } else {
            Vec::new()
        };
        if !safety.is_empty() && safety.len() != SAFETY_NODES.len() {
            return Err(format!("{SAFETY_URLS_VAR} must name 3 nodes, got {safety:?}").into());
        }
        let tag = services::unique_prefix("safety");
        Ok(Self {
            file_dir: std::env::temp_dir().join(&tag),
            tag,
            safety,
            clock_file: services::var(SAFETY_CLOCK_VAR).map(PathBuf::from),
            sentinel: services::var("LEASEHOLD_TEST_REDIS_SENTINEL_URL"),
            postgres: if want("postgres") {
                need(Service::Postgres)?.into_iter().next()
            } else {
                None
            },
            etcd: if want("etcd") {
                Some(need(Service::Etcd)?)
            } else {
                None
            },
            etcd_cluster: if want("etcd") {
                Some(need(Service::EtcdCluster)?)
            } else {
                None
            },
            memory: MemoryBackend::new(),
        })
    }
}

/// How to build one client's locker (on the client's own runtime).
#[derive(Clone)]
pub(super) enum Spec {
    Memory(MemoryBackend),
    File(PathBuf),
    Redis {
        url: String,
        response_timeout: Duration,
    },
    Redlock(Vec<String>),
    Postgres(String),
    Etcd {
        endpoints: Vec<String>,
        session: Duration,
    },
}

const HEALTH: Duration = Duration::from_millis(100);

impl Spec {
    pub(super) fn factory(
        self,
        ttl: Duration,
    ) -> impl FnOnce() -> futures_util::future::LocalBoxFuture<'static, Result<Locker, BoxError>>
    + Send
    + 'static {
        move || {
            async move {
                let opts = LockOptions::default().with_ttl(ttl);
                let locker = match self {
                    Spec::Memory(m) => Locker::new(m),
                    Spec::File(dir) => Locker::new(FileBackend::new(
                        FileConfig::new(dir).with_check_interval(Duration::from_millis(50)),
                    )?),
                    Spec::Redis {
                        url,
                        response_timeout,
                    } => {
                        let cfg = RedisConfig::from_url(&url)?
                            .with_timeouts(Duration::from_secs(1), response_timeout);
                        Locker::new(RedisBackend::connect(cfg).await?)
                    }
                    Spec::Redlock(urls) => {
                        Locker::new(RedlockBackend::new(RedlockConfig::from_urls(urls)?)?)
                    }
                    Spec::Postgres(url) => {
                        let cfg = PostgresConfig::from_url(&url)?
                            .with_health(HEALTH, HEALTH)?
                            .with_application_name(SAFETY_APP);
                        Locker::new(PostgresBackend::connect(cfg).await?)
                    }
                    Spec::Etcd { endpoints, session } => {
                        let cfg = EtcdConfig::new(endpoints)
                            .with_session_ttl(session)
                            .with_request_timeout(Duration::from_secs(10));
                        Locker::new(EtcdBackend::connect(cfg).await?)
                    }
                };
                Ok(locker.with_options(opts)?)
            }
            .boxed_local()
        }
    }
}

/// TTLs and pauses per backend: short, so that the full table takes minutes, and long enough
/// that a trial's own overhead (a node restart takes about half a second) does not decide it.
pub(super) struct Timing {
    pub(super) ttl: Duration,
    pub(super) pause: Duration,
}

pub(super) fn timing(backend: &str) -> Timing {
    match backend {
        // etcd's shortest lease is 2 s with the harness's 1 s election timeout; the pause
        // must outlast the session lease plus the lessor's expiry sweep (500 ms).
        "etcd" => Timing {
            ttl: Duration::from_secs(1),
            pause: Duration::from_millis(3_500),
        },
        "postgres" => Timing {
            ttl: Duration::from_millis(400),
            pause: Duration::from_millis(1_200),
        },
        _ => Timing {
            ttl: Duration::from_millis(300),
            pause: Duration::from_millis(1_000),
        },
    }
}

pub(super) fn addr_of(url: &str) -> Result<std::net::SocketAddr, BoxError> {
    let hostport = url
        .split_once("://")
        .map_or(url, |(_, r)| r)
        .split(['/', '?'])
        .next()
        .unwrap_or_default();
    let hostport = hostport.rsplit_once('@').map_or(hostport, |(_, h)| h);
    Ok(hostport.parse()?)
}

/// A proxy in front of `url`'s server, and `url` rewritten to go through it.
pub(super) async fn proxied(url: &str) -> Result<(FaultProxy, String), BoxError> {
    let addr = addr_of(url)?;
    let proxy = FaultProxy::start(addr).await?;
    let via = url.replacen(&addr.to_string(), &proxy.addr().to_string(), 1);
    Ok((proxy, via))
}

pub(super) fn opt<'a, T>(v: &'a Option<T>, what: &str) -> Result<&'a T, BoxError> {
    v.as_ref()
        .ok_or_else(|| format!("{what} is not configured").into())
}

/// The spec of the backend under test for both clients, when they connect alike.
pub(super) fn plain_spec(env: &Env, backend: &str) -> Result<Spec, BoxError> {
    Ok(match backend {
        "memory" => Spec::Memory(env.memory.clone()),
        "file" => Spec::File(env.file_dir.clone()),
        "redis" => Spec::Redis {
            url: env.safety[0].clone(),
            response_timeout: Duration::from_secs(1),
        },
        "redlock" => Spec::Redlock(env.safety.clone()),
        "postgres" => Spec::Postgres(opt(&env.postgres, "postgres")?.clone()),
        "etcd" => Spec::Etcd {
            endpoints: opt(&env.etcd, "etcd")?.clone(),
            session: Duration::from_secs(2),
        },
        other => return Err(format!("no spec for {other}").into()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxied_urls_keep_everything_but_the_address() -> Result<(), BoxError> {
        assert_eq!(
            addr_of("postgres://u:p@127.0.0.1:17432/db")?.to_string(),
            "127.0.0.1:17432"
        );
        assert_eq!(addr_of("redis://127.0.0.1:17451")?.port(), 17451);
        assert_eq!(addr_of("http://127.0.0.1:17479")?.port(), 17479);
        Ok(())
    }
}
