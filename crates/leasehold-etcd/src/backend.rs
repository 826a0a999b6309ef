//! [`EtcdBackend`]: the lock primitives over etcd's KV, lease and watch APIs.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};
use leasehold_core::{
    Capabilities, CrashRelease, DEFAULT_MAX_TTL, Error, ExtendRequest, FencingKind, Grant, Held,
    HolderInfo, LockBackend, LockKey, LockRequest, ReleaseGate, RenewalKind, SafetyClass, Validity,
    WaitKind, Waited, async_trait,
};
use tokio::time::Instant;

use crate::NAME;
use crate::client::Inner;
use crate::config::{EtcdConfig, LeaseMode};
use crate::error::with_timeout;
use crate::job::Mode;
use crate::session::MIN_LEASE_TTL;

/// What etcd guarantees and supports: a constant, as
/// [`LockBackend::capabilities`] requires.
const CAPABILITIES: Capabilities =
    Capabilities::new(NAME, SafetyClass::Correctness, FencingKind::Monotonic)
        .with_wait(WaitKind::Native)
        .with_renewal(RenewalKind::Session)
        .with_ttl_range(Duration::from_secs(1), DEFAULT_MAX_TTL)
        .with_crash_release(CrashRelease::TtlRoundedUp {
            step: Duration::from_secs(1),
            min: MIN_LEASE_TTL,
        })
        .with_elections()
        .with_semaphores();

/// Locks on etcd: consensus-backed, with the lock key's create revision as fencing token.
///
/// Cheap to clone (clones share the connection and the session lease). See the crate
/// documentation for the key layout, guarantees and cancellation behaviour.
#[derive(Clone)]
pub struct EtcdBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl EtcdBackend {
    /// Connects to etcd, checks that the key prefix can be read, and, in
    /// [`LeaseMode::Session`], grants the session lease (so a wrong address, password or
    /// missing permission shows here, not at the first lock).
    pub async fn connect(config: EtcdConfig) -> Result<Self, Error> {
        config.validate()?;
        if config.user.is_some() && !config.is_tls() {
            for endpoint in &config.endpoints {
                let host = endpoint.strip_prefix("http://").unwrap_or(endpoint);
                leasehold_core::transport::check_plaintext_password(
                    NAME,
                    host,
                    "etcd user:password over plain gRPC (http://)",
                    config.allow_plaintext_password,
                )?;
            }
        }
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_require_leader(true);
        if let Some(user) = &config.user {
            // etcd's auth tokens expire when unused for a while (5 min by default), and a
            // session that only sends keep-alives does not use its token: re-authenticate
            // when etcd says the token is invalid, instead of failing the next lock.
            opts = opts
                .with_user(user.clone(), config.password.clone().unwrap_or_default())
                .with_auto_token_refresh(true);
        }
        #[allow(unused_mut)]
        let mut endpoints = config.endpoints.clone();
        #[cfg(feature = "tls")]
        if let Some(tls) = &config.tls {
            let mut t = etcd_client::TlsOptions::new();
            if let Some(ca) = &tls.ca_pem {
                t = t.ca_certificate(etcd_client::Certificate::from_pem(ca));
            }
            if let Some(domain) = &tls.domain {
                t = t.domain_name(domain.clone());
            }
            if let Some((cert, key)) = &tls.identity {
                t = t.identity(etcd_client::Identity::from_pem(cert, key));
            }
            opts = opts.with_tls(t);
            endpoints = endpoints
                .iter()
                .map(|e| {
                    let bare = e.strip_prefix("http://").unwrap_or(e);
                    let bare = bare.strip_prefix("https://").unwrap_or(bare);
                    format!("https://{bare}")
                })
                .collect();
        }
        let timeout = config.connect_timeout + config.request_timeout;
        let client = with_timeout(timeout, "connect", None, || {
            Client::connect(endpoints.clone(), Some(opts.clone()))
        })
        .await
        .map_err(|e| e.into_core("connecting to etcd"))?;
        let backend = Self {
            inner: Arc::new(Inner::new(client, config)),
        };
        // A read under the prefix: a wrong address, a missing user or a user without access
        // to the prefix shows here, not at the first lock (etcd grants leases to anyone).
        let kv = backend.inner.client.kv_client();
        let prefix = backend.inner.config.prefix.clone();
        let reauth = Some(&backend.inner.reauth);
        with_timeout(
            backend.inner.config.request_timeout,
            "probe",
            reauth,
            || {
                let (mut kv, prefix) = (kv.clone(), prefix.clone());
                async move {
                    kv.get(prefix, Some(GetOptions::new().with_count_only()))
                        .await
                }
            },
        )
        .await
        .map_err(|e| e.into_core("reaching etcd"))?;
        if backend.inner.config.lease_mode == LeaseMode::Session {
            backend
                .inner
                .session(backend.inner.config.session_ttl)
                .await?;
        }
        Ok(backend)
    }

    /// The configuration in force.
    pub fn config(&self) -> &EtcdConfig {
        &self.inner.config
    }

    /// The id of the current session lease of locks whose TTL rounds to `session_ttl`'s (the
    /// lease granted on connecting), if one is alive ([`LeaseMode::Session`]), as `etcdctl lease
    /// list` shows it in hex. Locks of another TTL are on the session lease of their own TTL
    /// ([`session_lease_id_for`](Self::session_lease_id_for)).
    pub async fn session_lease_id(&self) -> Option<i64> {
        self.session_lease_id_for(self.inner.config.session_ttl)
            .await
    }

    /// The id of the live session lease of locks of `ttl` (one per TTL rounded up to whole
    /// seconds, at least 2 s), if there is one.
    pub async fn session_lease_id_for(&self, ttl: Duration) -> Option<i64> {
        self.inner.live_session(ttl).await.map(|s| s.id())
    }

    /// The etcd key prefix under which `key`'s waiters live: `<prefix><escaped key>/` (the
    /// crate docs' key mapping says how a key is escaped).
    pub fn lock_prefix(&self, key: &LockKey) -> String {
        crate::lock_prefix(&self.inner.config.prefix, key)
    }

    async fn lock(&self, req: LockRequest<'_>, mode: Mode) -> Result<Option<Grant>, Error> {
        crate::job::lock_under(
            &self.inner,
            self.lock_prefix(req.key).into_bytes(),
            req,
            mode,
        )
        .await
    }
}

#[async_trait]
impl LockBackend for EtcdBackend {
    /// A permit view sharing this backend's connection and session leases (the crate docs'
    /// "Semaphores" section gives its key layout).
    fn semaphore(
        self: Arc<Self>,
        limit: leasehold_core::PermitLimit,
    ) -> Result<Arc<dyn leasehold_core::PermitBackend>, Error> {
        Ok(Arc::new(crate::semaphore::EtcdPermits::new(
            Arc::clone(&self.inner),
            CAPABILITIES,
            limit,
        )))
    }

    fn election(
        self: Arc<Self>,
        candidate: leasehold_core::Candidate,
    ) -> Result<Arc<dyn leasehold_core::ElectionBackend>, Error> {
        Ok(Arc::new(crate::election::EtcdElection::new(
            Arc::clone(&self.inner),
            CAPABILITIES,
            candidate,
        )))
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.lock(req, Mode::Try).await
    }

    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        let grant = self.lock(req, Mode::Wait(deadline)).await?;
        Ok(Waited::new(grant, 1))
    }

    fn release_gate(&self) -> Option<&ReleaseGate> {
        Some(&self.inner.releases)
    }

    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        crate::held::release(&self.inner, self.lock_prefix(held.key), held).await
    }

    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        crate::held::extend(&self.inner, self.lock_prefix(req.held.key), req).await
    }

    /// No batch request here: each grant in turn.
    async fn extend_many(
        &self,
        reqs: &[leasehold_core::ExtendRequest<'_>],
    ) -> Vec<leasehold_core::Extended> {
        leasehold_core::extend_each(self, reqs).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        crate::job::first_holder(&self.inner, self.lock_prefix(key)).await
    }
}
