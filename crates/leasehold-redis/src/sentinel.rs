//! Redis Sentinel: `redis+sentinel://` (and `rediss+sentinel://`) URLs, master discovery through
//! the sentinels, and re-discovery after a failover.
//!
//! The connection to the master is the same auto-reconnecting, multiplexed connection as for
//! one server. When a request to it fails in a way a failover causes (the connection refused,
//! dropped or timed out, or a `READONLY` answer from a master demoted to a replica), the
//! sentinels are asked again who the master is; if it is another server, the next requests go
//! there (with the release channels subscribed again). The failed request itself returns its
//! error, which leasehold's callers already treat as transient.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use leasehold_core::{Error, redact};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{Cmd, ConnectionAddr, Pipeline, ProtocolVersion, RedisError, RedisFuture, Value};
use tokio::sync::{Mutex as AsyncMutex, RwLock};

use crate::config::invalid;

/// The URL schemes: plain TCP, and TLS to the sentinels and the master alike.
pub(crate) const SENTINEL_SCHEMES: &[&str] = &["redis+sentinel", "rediss+sentinel"];

/// Where the sentinels are, which master they watch, and how to log in to each.
#[derive(Clone)]
pub(crate) struct SentinelTarget {
    sentinels: Vec<(String, u16)>,
    service: String,
    tls: bool,
    db: i64,
    master_user: Option<String>,
    master_password: Option<String>,
    sentinel_user: Option<String>,
    sentinel_password: Option<String>,
    /// The URL with its passwords replaced.
    pub(crate) redacted: String,
}

impl SentinelTarget {
    /// A password for the master or the sentinels over `redis+sentinel://` (no TLS) to a
    /// sentinel that is not on loopback: warned about, or refused when `allow` is false (the
    /// master's address is learnt from the sentinels, so theirs are the hosts we know).
    pub(crate) fn check_plaintext(&self, backend: &'static str, allow: bool) -> Result<(), Error> {
        if self.tls || (self.master_password.is_none() && self.sentinel_password.is_none()) {
            return Ok(());
        }
        self.sentinels.iter().try_for_each(|(host, _)| {
            leasehold_core::transport::check_plaintext_password(
                backend,
                host,
                "a Redis password over redis+sentinel:// without TLS",
                allow,
            )
        })
    }
}

fn decode(backend: &'static str, s: &str) -> Result<String, Error> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map(|c| c.into_owned())
        .map_err(|_| invalid(backend, "a URL credential is not UTF-8"))
}

/// `user:password` (either may be empty) of a URL's userinfo.
fn credentials(
    backend: &'static str,
    userinfo: &str,
) -> Result<(Option<String>, Option<String>), Error> {
    if userinfo.is_empty() {
        return Ok((None, None));
    }
    let (u, p) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let some = |s: &str| -> Result<Option<String>, Error> {
        (!s.is_empty()).then(|| decode(backend, s)).transpose()
    };
    Ok((some(u)?, some(p)?))
}

impl SentinelTarget {
    /// Parses `redis+sentinel://[user:password@]host:port,host:port,…/service[/db]` (or
    /// `rediss+sentinel://…`); the sentinels' own credentials come as `sentinel_user` and
    /// `sentinel_password` (already taken out of the query).
    pub(crate) fn parse(
        backend: &'static str,
        url: &str,
        sentinel_user: Option<&str>,
        sentinel_password: Option<&str>,
    ) -> Result<Self, Error> {
        leasehold_core::redaction::refuse_unencoded_userinfo(backend, url)?;
        let redacted = redact(url);
        let bad = |why: &str| invalid(backend, format!("{redacted}: {why}"));
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let tls = scheme == "rediss+sentinel";
        if !tls && scheme != "redis+sentinel" {
            return Err(bad("expected redis+sentinel:// or rediss+sentinel://"));
        }
        if rest.contains('?') {
            return Err(bad("unknown query option"));
        }
        let (authority, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("no service name (…/SERVICE)"))?;
        let (userinfo, hosts) = authority.rsplit_once('@').unwrap_or(("", authority));
        let (master_user, master_password) = credentials(backend, userinfo)?;
        let mut sentinels = Vec::new();
        for h in hosts.split(',').filter(|h| !h.is_empty()) {
            let (host, port) = h.rsplit_once(':').unwrap_or((h, "26379"));
            let port = port
                .parse()
                .map_err(|_| bad(&format!("bad sentinel port in {h:?}")))?;
            sentinels.push((host.trim_matches(['[', ']']).to_owned(), port));
        }
        if sentinels.is_empty() {
            return Err(bad("no sentinel address"));
        }
        let mut parts = path.split('/').filter(|p| !p.is_empty());
        let service = decode(backend, parts.next().ok_or_else(|| bad("no service name"))?)?;
        let db = match parts.next() {
            Some(d) => d.parse().map_err(|_| bad("the database is not a number"))?,
            None => 0,
        };
        let owned = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_owned);
        Ok(Self {
            sentinels,
            service,
            tls,
            db,
            master_user,
            master_password,
            sentinel_user: owned(sentinel_user),
            sentinel_password: owned(sentinel_password),
            redacted,
        })
    }

    /// `sentinel h:p,h:p/service`, for messages.
    pub(crate) fn name(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(h, p)| format!("{h}:{p}"))
            .collect();
        format!("sentinel {}/{}", hosts.join(","), self.service)
    }

    /// A redis-rs Sentinel client for the master (RESP3 to the master, for wake-up pushes),
    /// trusting `ca` (PEM) for TLS when given.
    pub(crate) fn client(
        &self,
        backend: &'static str,
        ca: Option<&[u8]>,
    ) -> Result<SentinelClient, Error> {
        let addrs = self.sentinels.iter().map(|(host, port)| {
            if self.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
        });
        let fail = |e: RedisError| invalid(backend, format!("{}: {}", self.redacted, e.category()));
        let mut b = SentinelClientBuilder::new(addrs, &self.service, SentinelServerType::Master)
            .map_err(fail)?
            .set_client_to_redis_protocol(ProtocolVersion::RESP3)
            .set_client_to_redis_db(self.db);
        if let Some(u) = &self.master_user {
            b = b.set_client_to_redis_username(u);
        }
        if let Some(p) = &self.master_password {
            b = b.set_client_to_redis_password(p);
        }
        if let Some(u) = &self.sentinel_user {
            b = b.set_client_to_sentinel_username(u);
        }
        if let Some(p) = &self.sentinel_password {
            b = b.set_client_to_sentinel_password(p);
        }
        if self.tls {
            crate::config::install_crypto_provider();
            b = b
                .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
            if let Some(ca) = ca {
                let certs = || redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.to_vec()),
                };
                b = b
                    .set_client_to_redis_certificates(certs())
                    .set_client_to_sentinel_certificates(certs());
            }
        }
        b.build().map_err(fail)
    }
}

/// How to connect to the master a set of sentinels names.
pub(crate) struct SentinelConnector {
    client: AsyncMutex<SentinelClient>,
    config: ConnectionManagerConfig,
}

impl SentinelConnector {
    pub(crate) fn new(client: SentinelClient, config: ConnectionManagerConfig) -> Self {
        Self {
            client: AsyncMutex::new(client),
            config,
        }
    }

    /// Asks the sentinels for the master: a client for it.
    pub(crate) async fn master_client(&self) -> Result<redis::Client, RedisError> {
        self.client.lock().await.async_get_client().await
    }

    /// Asks the sentinels for the master and connects to it.
    async fn master(&self) -> Result<(String, ConnectionManager), RedisError> {
        let client = self.master_client().await?;
        let addr = client.get_connection_info().addr().to_string();
        let conn = ConnectionManager::new_with_config(client, self.config.clone()).await?;
        Ok((addr, conn))
    }

    /// The first connection; later ones come from [`SentinelConn`]'s re-discovery.
    pub(crate) async fn connect(self: &Arc<Self>) -> Result<SentinelConn, RedisError> {
        let (addr, conn) = self.master().await?;
        Ok(SentinelConn(Arc::new(Shared {
            connector: Arc::clone(self),
            current: RwLock::new(Current {
                generation: 0,
                addr,
                conn,
            }),
            channels: Mutex::new(BTreeSet::new()),
        })))
    }
}

struct Current {
    generation: u64,
    addr: String,
    conn: ConnectionManager,
}

struct Shared {
    connector: Arc<SentinelConnector>,
    current: RwLock<Current>,
    /// The channels subscribed, to subscribe again on a new master.
    channels: Mutex<BTreeSet<String>>,
}

/// The connection to whichever server the sentinels call master.
#[derive(Clone)]
pub(crate) struct SentinelConn(Arc<Shared>);

/// Whether `e` is what a failover looks like from the client.
fn failover_symptom(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || e.code() == Some("READONLY")
}

impl SentinelConn {
    async fn current(&self) -> (u64, ConnectionManager) {
        let c = self.0.current.read().await;
        (c.generation, c.conn.clone())
    }

    /// Asks the sentinels again, unless someone did since `seen`; switches to the master they
    /// name if it is another server.
    async fn rediscover(&self, seen: u64) {
        let mut cur = self.0.current.write().await;
        if cur.generation != seen {
            return;
        }
        let Ok((addr, mut conn)) = self.0.connector.master().await else {
            return;
        };
        cur.generation += 1;
        if addr == cur.addr {
            return;
        }
        let channels: Vec<String> = self
            .0
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        for ch in channels {
            let _ = conn.subscribe(&ch).await;
        }
        tracing::info!(from = %cur.addr, to = %addr, "redis sentinel: the master moved");
        cur.addr = addr;
        cur.conn = conn;
    }

    async fn run<T, F>(&self, f: F) -> Result<T, RedisError>
    where
        F: AsyncFnOnce(&mut ConnectionManager) -> Result<T, RedisError>,
    {
        self.run_checked(f, |_| false).await
    }

    /// [`run`](Self::run), also asking the sentinels again when `symptom` says an answer that
    /// arrived shows a failover: a pipeline's server errors come back as values, turned into
    /// an error only by the caller, so a demoted master's `READONLY` to a pipelined acquire
    /// would otherwise never send us to the new master.
    async fn run_checked<T, F>(&self, f: F, symptom: impl Fn(&T) -> bool) -> Result<T, RedisError>
    where
        F: AsyncFnOnce(&mut ConnectionManager) -> Result<T, RedisError>,
    {
        let (generation, mut conn) = self.current().await;
        let r = f(&mut conn).await;
        let failover = match &r {
            Err(e) => failover_symptom(e),
            Ok(v) => symptom(v),
        };
        if failover {
            self.rediscover(generation).await;
        }
        r
    }

    pub(crate) async fn subscribe(&self, channel: &str) -> Result<(), RedisError> {
        self.0
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(channel.to_owned());
        self.run(async |c| c.subscribe(channel).await).await
    }

    pub(crate) async fn unsubscribe(&self, channel: &str) -> Result<(), RedisError> {
        self.0
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(channel);
        self.run(async |c| c.unsubscribe(channel).await).await
    }
}

impl ConnectionLike for SentinelConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.run(async |c| c.req_packed_command(cmd).await))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let read_only = |values: &Vec<Value>| {
            values
                .iter()
                .any(|v| matches!(v, Value::ServerError(e) if e.code() == "READONLY"))
        };
        Box::pin(self.run_checked(
            async move |c| c.req_packed_commands(pipeline, offset, count).await,
            read_only,
        ))
    }

    fn get_db(&self) -> i64 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_names_sentinels_service_db_and_both_logins() -> Result<(), Error> {
        let t = SentinelTarget::parse(
            "redis",
            "redis+sentinel://app:s%40cret@10.0.0.1:26379,10.0.0.2/mymaster/3",
            Some("watcher"),
            Some("pw"),
        )?;
        assert_eq!(
            t.sentinels,
            [("10.0.0.1".into(), 26379), ("10.0.0.2".into(), 26379)]
        );
        assert_eq!((t.service.as_str(), t.db, t.tls), ("mymaster", 3, false));
        assert_eq!(t.master_user.as_deref(), Some("app"));
        assert_eq!(t.master_password.as_deref(), Some("s@cret"));
        assert_eq!(t.sentinel_user.as_deref(), Some("watcher"));
        assert!(!t.redacted.contains("cret"), "{}", t.redacted);
        assert_eq!(t.name(), "sentinel 10.0.0.1:26379,10.0.0.2:26379/mymaster");
        let tls = SentinelTarget::parse("redis", "rediss+sentinel://h:1/m", None, None)?;
        assert!(tls.tls && tls.master_password.is_none());
        for bad in [
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel:///m",
            "redis+sentinel://h:x/m",
            "redis+sentinel://h:1/m/x",
        ] {
            assert!(
                SentinelTarget::parse("redis", bad, None, None).is_err(),
                "{bad}"
            );
        }
        Ok(())
    }
}
