//! The [`Locker`]: every convenience, implemented once over any backend.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::LockBackendExt as _;
use crate::backend::{Held, HolderInfo, LockBackend, LockRequest};
use crate::caps::{Capabilities, RenewalKind, WaitKind};
use crate::error::{Error, ErrorKind};
use crate::key::{IntoLockKey, LockKey};
use crate::lease::{Lease, LeaseInfo};
use crate::loss::LossReason;
use crate::metrics;
use crate::policy::{API, LockOptions};
use crate::release::{Horizon, gated_release, release_in_background};
use crate::renewal::Renewer;
use crate::signal::{LeaseMonitor, Shared};
use crate::token::Owner;

/// Acquires leases from one backend: trying once, waiting with a budget, renewing, and cleaning
/// up after cancelled acquisitions. Cheap to clone (the backend and options are shared).
///
/// ```
/// # async fn demo() -> Result<(), leasehold_core::Error> {
/// use std::time::Duration;
/// use leasehold_core::{Locker, MemoryBackend};
///
/// let locker = Locker::new(MemoryBackend::new());
/// let lease = locker.acquire("reports/daily", Duration::from_secs(5)).await?;
/// let token = lease.fencing_token(); // send it with every write
/// assert!(locker.try_acquire("reports/daily").await?.is_none()); // held: not an error
/// assert!(lease.release().await?);
/// # let _ = token; Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
///
/// # Cancellation
///
/// Every method is cancel-safe: dropping an acquire future at any await point leaves nothing
/// held. If the future is dropped while a request is in flight (or a request fails in a way that
/// leaves its outcome unknown), the `Locker` releases by owner value in the background, so a
/// grant that reached the server anyway does not linger until its TTL.
///
/// # Renewal
///
/// On backends that renew by extending a TTL, one renewal engine per locker (shared by its
/// clones; a locker made again from the same backend has its own) renews every lease it handed
/// out: one task, a queue ordered by due time, and every lease due within an eighth of the
/// renewal interval renewed together through [`LockBackend::extend_many`] (at most
/// [`MAX_BATCH`](crate::MAX_BATCH) per call). Each lease keeps its own outcome and its own
/// deadline; a released or dropped lease leaves the queue at once.
#[derive(Clone, Debug)]
pub struct Locker {
    backend: Arc<dyn LockBackend>,
    caps: Capabilities,
    options: Arc<LockOptions>,
    /// Renews every lease this locker (and its clones) handed out, in batches.
    pub(crate) renewer: Renewer,
}

enum Mode {
    Try,
    Wait(Instant),
}

impl Locker {
    /// A locker over `backend` with default [`LockOptions`] (30 s TTL, renewal every 10 s).
    pub fn new(backend: impl LockBackend) -> Self {
        Self::from_arc(Arc::new(backend))
    }

    /// A locker over a shared backend (for example one chosen by configuration).
    pub fn from_arc(backend: Arc<dyn LockBackend>) -> Self {
        let caps = backend.capabilities();
        let mut options = LockOptions::default();
        // The default TTL must suit the backend; clamp it into the declared range.
        options.ttl = options.ttl.clamp(caps.min_ttl, caps.max_ttl);
        Self {
            renewer: Renewer::new(Arc::clone(&backend)),
            backend,
            caps,
            options: Arc::new(options),
        }
    }

    /// The same locker with other options, checked against the backend's capabilities.
    pub fn with_options(mut self, options: LockOptions) -> Result<Self, Error> {
        options.validate(&self.caps)?;
        self.options = Arc::new(options);
        Ok(self)
    }

    /// The same locker with another TTL.
    pub fn with_ttl(self, ttl: Duration) -> Result<Self, Error> {
        let options = (*self.options).clone().with_ttl(ttl);
        self.with_options(options)
    }

    /// The options in force.
    pub fn options(&self) -> &LockOptions {
        &self.options
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn LockBackend> {
        &self.backend
    }

    /// The backend's capabilities.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    /// One attempt: `Ok(None)` if someone else holds the lock (contention is not an error).
    pub async fn try_acquire(&self, key: impl IntoLockKey) -> Result<Option<Lease>, Error> {
        let key = key
            .into_lock_key()
            .map_err(|e| Error::invalid_key(self.backend.name(), e))?;
        let span = tracing::debug_span!("leasehold.try_acquire", backend = self.backend.name(), key = %key);
        async {
            // The call's duration feeds only the metrics and the debug log: read the clock for
            // them only (the attempt reads its own, for the validity).
            let started = (cfg!(feature = "metrics") || tracing::enabled!(tracing::Level::DEBUG))
                .then(Instant::now);
            let result = self.attempt(&key, Mode::Try).await.map(|(lease, _)| lease);
            let outcome = result.as_ref().map(Option::is_some);
            if let Some(started) = started {
                metrics::acquired(self.backend.name(), &outcome, started);
            }
            log_outcome(&outcome, 1, started);
            result
        }
        .instrument(span)
        .await
    }

    /// Acquires the lock, waiting at most `wait`.
    ///
    /// Uses the backend's native wait when it has one, else retries with capped, fully jittered
    /// exponential backoff ([`Backoff`](crate::Backoff)). A zero budget makes exactly one
    /// attempt. Retryable faults are retried within the budget too. At the deadline the error is
    /// [`ErrorKind::Timeout`], with [`Error::attempts`] set and the last fault, if any, as its
    /// source.
    pub async fn acquire(&self, key: impl IntoLockKey, wait: Duration) -> Result<Lease, Error> {
        let key = key
            .into_lock_key()
            .map_err(|e| Error::invalid_key(self.backend.name(), e))?;
        let span =
            tracing::debug_span!("leasehold.acquire", backend = self.backend.name(), key = %key);
        async {
            let started = Instant::now();
            let mut attempts = 0u32;
            let result = self.acquire_inner(&key, wait, started, &mut attempts).await;
            let outcome = result.as_ref().map(|_| true);
            metrics::acquired(self.backend.name(), &outcome, started);
            log_outcome(&outcome, attempts, Some(started));
            result
        }
        .instrument(span)
        .await
    }

    async fn acquire_inner(
        &self,
        key: &LockKey,
        wait: Duration,
        started: Instant,
        attempts: &mut u32,
    ) -> Result<Lease, Error> {
        let deadline = started
            .checked_add(wait)
            .unwrap_or(started + Duration::from_secs(86_400 * 365));
        let native = self.caps.wait == WaitKind::Native && !wait.is_zero();
        let mut last_fault: Option<Error> = None;
        let mut retry = 0u32;
        loop {
            let mode = if native {
                Mode::Wait(deadline)
            } else {
                Mode::Try
            };
            match self.attempt(key, mode).await {
                Ok((Some(lease), n)) => {
                    *attempts += n;
                    return Ok(lease);
                }
                Ok((None, n)) => *attempts += n,
                Err(e) if e.is_retryable() => {
                    *attempts += 1;
                    tracing::debug!(error = %e, "leasehold.acquire: retryable fault");
                    last_fault = Some(e);
                }
                Err(e) => return Err(e),
            }
            let now = Instant::now();
            if now >= deadline {
                let mut err = Error::new(
                    ErrorKind::Timeout,
                    self.backend.name(),
                    format!("could not acquire {key:?} within {wait:?}"),
                )
                .with_attempts(*attempts);
                if let Some(fault) = last_fault {
                    err = err.with_source(fault);
                }
                return Err(err);
            }
            retry += 1;
            let delay = self.options.backoff.delay(retry).min(deadline - now);
            if delay.is_zero() {
                tokio::task::yield_now().await;
            } else {
                tokio::time::sleep(delay).await;
            }
        }
    }

    /// Acquires the lock (waiting at most `wait`), runs `work` under the lease, then releases.
    ///
    /// `work` receives a [`LeaseInfo`] (key, fencing token, lost signal). If the lease is lost
    /// before `work` finishes, `work` is cancelled and the error is [`ErrorKind::LeaseLost`]. A
    /// failure to release after `work` succeeded is logged, not returned: the work's result is
    /// not thrown away, and the grant ends by its TTL or session.
    pub async fn with_lock<F, Fut, T>(
        &self,
        key: impl IntoLockKey,
        wait: Duration,
        work: F,
    ) -> Result<T, Error>
    where
        F: FnOnce(LeaseInfo) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = self.acquire(key, wait).await?;
        let out = lease.run(work(lease.info())).await;
        if let Err(e) = lease.release().await {
            tracing::warn!(key = %lease.key(), error = %e, "leasehold.with_lock: release failed");
        }
        out
    }

    /// What the backend can tell about the current holder of `key`.
    pub async fn inspect(&self, key: impl IntoLockKey) -> Result<Option<HolderInfo>, Error> {
        let key = key
            .into_lock_key()
            .map_err(|e| Error::invalid_key(self.backend.name(), e))?;
        self.backend.inspect(&key).await
    }

    /// One request to the backend, with cleanup if it is cancelled or its outcome is unknown.
    async fn attempt(&self, key: &LockKey, mode: Mode) -> Result<(Option<Lease>, u32), Error> {
        let owner = Owner::random().map_err(|e| {
            Error::new(ErrorKind::Unavailable, API, "the OS random source failed").with_source(e)
        })?;
        let ttl = self.options.ttl;
        let shared = Shared::new(self.options.drift, self.backend.name());
        let monitor = LeaseMonitor::new(&shared);
        let started = Instant::now();
        let cleanup = Cleanup {
            key,
            owner: &owner,
            locker: self,
            armed: true,
        };
        let req = LockRequest::new(key, &owner, ttl, started, &monitor);
        let outcome = match mode {
            Mode::Try => self.backend.try_lock(req).await.map(|g| (g, 1)),
            Mode::Wait(deadline) => self
                .backend
                .wait_lock(req, deadline)
                .await
                .map(|w| (w.grant, w.attempts.max(1))),
        };
        let (grant, attempts) = match outcome {
            Ok(v) => {
                let contended = v.1 - u32::from(v.0.is_some());
                metrics::attempted(self.backend.name(), v.1, contended);
                v
            }
            Err(e) => {
                metrics::attempted(self.backend.name(), 1, 0);
                // Our request may have reached the server; unless the error says nothing was
                // sent, the cleanup releases by owner as it drops.
                if matches!(
                    e.kind(),
                    ErrorKind::InvalidKey
                        | ErrorKind::InvalidArgument
                        | ErrorKind::InvalidConfig
                        | ErrorKind::Unsupported
                ) {
                    cleanup.disarm();
                }
                return Err(e);
            }
        };
        cleanup.disarm();
        let Some(grant) = grant else {
            return Ok((None, attempts));
        };
        let lease = Lease::new(
            key.clone(),
            owner,
            grant,
            Arc::clone(&self.backend),
            shared,
            ttl,
        );
        if let Some(why) = lease.loss_reason() {
            // The grant is of no use: its answer came too late (past its validity), or the
            // backend reported it lost before it could be handed out (its session died).
            // Dropping the lease releases it.
            let (kind, msg) = match why {
                LossReason::Expired => (
                    ErrorKind::Timeout,
                    format!("the grant of {key:?} arrived after its validity deadline"),
                ),
                other => (
                    ErrorKind::Unavailable,
                    format!("the grant of {key:?} was lost before it was handed out: {other}"),
                ),
            };
            return Err(Error::new(kind, self.backend.name(), msg));
        }
        if self.caps.renewal == RenewalKind::Extend
            && let Some(interval) = self.options.renewal_interval()
        {
            lease.start_watchdog(&self.renewer, self.options.renewal, interval);
        }
        Ok((Some(lease), attempts))
    }
}

/// Logs how an acquisition ended. The fields are evaluated only when the event is enabled, so
/// the clock is read only for a debug log that is written.
fn log_outcome(result: &Result<bool, &Error>, attempts: u32, started: Option<Instant>) {
    let elapsed_ms = || started.map(|s| s.elapsed().as_secs_f64() * 1e3);
    match result {
        Ok(true) => tracing::debug!(outcome = "acquired", attempts, elapsed_ms = elapsed_ms()),
        Ok(false) => {
            tracing::debug!(
                outcome = "held elsewhere",
                attempts,
                elapsed_ms = elapsed_ms()
            );
        }
        Err(e) => {
            tracing::debug!(outcome = "failed", error = %e, attempts, elapsed_ms = elapsed_ms());
        }
    }
}

/// Releases by owner, in the background, an acquisition whose outcome was never seen: armed
/// until [`disarm`](Self::disarm)ed. It borrows, and clones only when it must release.
/// Transient faults are retried as for a dropped lease, until the grant's TTL, counted from
/// the clean-up (the request that may have granted, a native wait's last attempt included,
/// was sent before it), has passed.
struct Cleanup<'a> {
    key: &'a LockKey,
    owner: &'a Owner,
    locker: &'a Locker,
    armed: bool,
}

impl Cleanup<'_> {
    /// The outcome was seen: nothing to clean up.
    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (caps, options) = (&self.locker.caps, &self.locker.options);
        let horizon = Horizon::of(caps, Instant::now(), options.ttl, &options.drift);
        let backend = Arc::clone(&self.locker.backend);
        let key = self.key.clone();
        let owner = self.owner.clone();
        release_in_background(backend.name(), horizon, false, move || {
            let (backend, key, owner) = (Arc::clone(&backend), key.clone(), owner.clone());
            async move { gated_release(&*backend, Held::new(&key, &owner, None, None)).await }
        });
    }
}
