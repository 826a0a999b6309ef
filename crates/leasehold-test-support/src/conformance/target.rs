//! What the suite runs against ([`Target`]), what a failed check reports ([`Failure`]), and the
//! small helpers every check uses.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Capabilities, Error, Lease, LockBackend, LockKey, Locker};
use rand::Rng;
use tokio::time::Instant;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Counts the grants a backend still holds (for the leak check after cancellations).
pub type HeldHook = Arc<dyn Fn() -> BoxFuture<'static, Result<usize, Error>> + Send + Sync>;

/// Makes a held grant lapse for real (sleep past the TTL, kill the session, revoke the lease).
pub type ExpireHook = Arc<dyn for<'a> Fn(&'a Lease) -> BoxFuture<'a, ()> + Send + Sync>;

/// What the suite runs against.
#[derive(Clone)]
pub struct Target {
    /// The first client.
    pub primary: Arc<dyn LockBackend>,
    /// A second, independent client of the same lock service (its own connection or session);
    /// the same instance for an in-process backend.
    pub other: Arc<dyn LockBackend>,
    /// A TTL short enough to wait out in a test, within the backend's range.
    pub short_ttl: Duration,
    /// Counts what the backend still holds; without it the suite asks
    /// [`LockBackend::inspect`] about the keys it used.
    pub held: Option<HeldHook>,
    /// Makes a grant lapse; without it the suite sleeps past the TTL.
    pub expire: Option<ExpireHook>,
    /// How long background releases may take to land.
    pub settle: Duration,
    /// What must live as long as the backends (a test folder), dropped with the last clone of
    /// the target.
    pub keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl Target {
    /// A target with no hooks and a 5 s settle time.
    pub fn new(
        primary: Arc<dyn LockBackend>,
        other: Arc<dyn LockBackend>,
        short_ttl: Duration,
    ) -> Self {
        Self {
            primary,
            other,
            short_ttl,
            held: None,
            expire: None,
            settle: Duration::from_secs(5),
            keep: None,
        }
    }

    /// Adds the held-count hook.
    pub fn with_held(self, hook: HeldHook) -> Self {
        let held = Some(hook);
        Self { held, ..self }
    }

    /// Adds the expiry hook.
    pub fn with_expire(self, hook: ExpireHook) -> Self {
        let expire = Some(hook);
        Self { expire, ..self }
    }

    /// Keeps `value` (a test folder the backends use) until the target is dropped.
    pub fn keeping(self, value: impl std::any::Any + Send + Sync) -> Self {
        let keep: Option<Arc<dyn std::any::Any + Send + Sync>> = Some(Arc::new(value));
        Self { keep, ..self }
    }

    pub(super) fn caps(&self) -> Capabilities {
        self.primary.capabilities()
    }

    /// A TTL long enough that nothing in a check outlives it by accident.
    pub(super) fn long_ttl(&self) -> Duration {
        let caps = self.caps();
        Duration::from_secs(20).clamp(caps.min_ttl, caps.max_ttl)
    }

    pub(super) fn locker(
        &self,
        backend: &Arc<dyn LockBackend>,
        ttl: Duration,
        renewal: leasehold_core::Renewal,
    ) -> Result<Locker, Failure> {
        // Retries come fast: the checks contend hard and must not wait out long backoffs.
        let backoff = leasehold_core::Backoff {
            initial: Duration::from_millis(2),
            max: Duration::from_millis(50),
        };
        Locker::from_arc(Arc::clone(backend))
            .with_options(crate::harness::options(ttl, renewal).with_backoff(backoff))
            .map_err(|e| Failure::new("setup", format!("locker options rejected: {e}")))
    }

    pub(super) async fn expire(&self, lease: &Lease, ttl: Duration) {
        match &self.expire {
            Some(hook) => hook(lease).await,
            None => tokio::time::sleep(ttl + Duration::from_millis(50)).await,
        }
    }
}

/// A failed check: which one, and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The check's name.
    pub check: &'static str,
    /// What went wrong.
    pub message: String,
}

impl Failure {
    pub(super) fn new(check: &'static str, message: impl Into<String>) -> Self {
        Self {
            check,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "conformance check `{}` failed: {}",
            self.check, self.message
        )
    }
}

impl std::error::Error for Failure {}

/// Turns an unexpected backend error into a failure of `check`.
pub(super) fn op<T>(check: &'static str, what: &str, r: Result<T, Error>) -> Result<T, Failure> {
    r.map_err(|e| Failure::new(check, format!("{what}: unexpected error: {e}")))
}

/// The contention pattern of several checks: `workers` tasks (alternating between the two
/// clients, renewal on) each take `key` `rounds` times, waiting their turn, and hand each lease
/// to `step`, which releases it. The first failure, or a worker's panic, fails `check`.
pub(super) async fn in_turns<F, Fut>(
    t: &Target,
    check: &'static str,
    key: &LockKey,
    workers: usize,
    rounds: usize,
    step: F,
) -> Result<(), Failure>
where
    F: Fn(Lease) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<(), Failure>> + Send,
{
    let mut tasks = Vec::new();
    for w in 0..workers {
        let backend = if w.is_multiple_of(2) {
            &t.primary
        } else {
            &t.other
        };
        let locker = t.locker(backend, t.long_ttl(), leasehold_core::Renewal::Auto)?;
        let (key, step) = (key.clone(), step.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..rounds {
                let lease = locker.acquire(&key, Duration::from_secs(60)).await;
                step(op(check, "acquire", lease)?).await?;
            }
            Ok::<(), Failure>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure::new(check, format!("worker panicked: {e}")))??;
    }
    Ok(())
}

/// One `try_acquire` that must answer within `limit`, whatever its answer.
pub(super) async fn prompt_try(
    check: &'static str,
    locker: &Locker,
    key: &LockKey,
    limit: Duration,
) -> Result<Option<Lease>, Failure> {
    let t0 = Instant::now();
    let got = op(check, "try_acquire", locker.try_acquire(key).await)?;
    ensure!(
        check,
        t0.elapsed() < limit,
        "try_acquire took {:?}",
        t0.elapsed()
    );
    Ok(got)
}

/// A key unique to this run and check, so runs and checks never see each other's locks.
pub fn unique_key(check: &str) -> Result<LockKey, Failure> {
    let salt: u64 = rand::rng().random();
    let name: String = check.chars().take(64).collect();
    LockKey::new(format!("lh-conf-{salt:016x}-{name}"))
        .map_err(|e| Failure::new("setup", format!("bad test key: {e}")))
}
