//! The conformance suite: the contract every backend must pass, as plain async functions.
//!
//! Each check takes a [`Target`] (two independent clients of one lock service and a few hooks)
//! and returns `Err(Failure)` instead of panicking, so the suite's own tests can show that a
//! deliberately broken backend fails it. A driver's tests run the whole list with
//! [`conformance_tests!`](crate::conformance_tests), given an `async fn() -> Option<Target>`;
//! `tests/memory_conformance.rs` in this crate is the smallest example.
//!
//! The checks, in the order of the foundation issue:
//! 1. [`mutual_exclusion`]: W workers × M non-atomic increments, exact total, no overlap, fenced
//!    writes all accepted;
//! 2. [`try_and_wait`]: `try_acquire` on a held key is `Ok(None)` promptly, a waiter gets the
//!    lock after release, a wait with a budget times out cleanly;
//! 3. [`own_grant_only`]: after our grant lapses and another client acquires, our release says
//!    "not held", their lock survives, our extend fails, our lost signal has fired, and our
//!    stale fenced write is rejected;
//! 4. [`fencing_tokens`]: tokens strictly increase across holders (or are consistently absent);
//! 5. [`validity_deadline`]: the deadline is never later than send instant + ttl − drift;
//! 6. [`watchdog`]: renewal keeps a lease across 5 TTLs; without renewal the lost signal fires
//!    before another client can acquire;
//! 7. [`cancellation`]: 1,000 acquires dropped at random points leave nothing held;
//! 8. [`bad_input`]: bad keys and TTLs are typed errors, not panics.

use std::fmt;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use leasehold_core::{
    Capabilities, Error, ErrorKind, ExtendRequest, Grant, Held, HolderInfo, KeyError, Lease,
    LockBackend, LockKey, LockOptions, LockRequest, Locker, RenewalKind, Validity, Waited,
    async_trait,
};
use rand::Rng;
use tokio::time::Instant;

use crate::fence::FencedResource;

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
        }
    }

    /// Adds the held-count hook.
    pub fn with_held(mut self, hook: HeldHook) -> Self {
        self.held = Some(hook);
        self
    }

    /// Adds the expiry hook.
    pub fn with_expire(mut self, hook: ExpireHook) -> Self {
        self.expire = Some(hook);
        self
    }

    fn caps(&self) -> Capabilities {
        self.primary.capabilities()
    }

    /// A TTL long enough that nothing in a check outlives it by accident.
    fn long_ttl(&self) -> Duration {
        let caps = self.caps();
        Duration::from_secs(20).clamp(caps.min_ttl, caps.max_ttl)
    }

    fn locker(
        &self,
        backend: &Arc<dyn LockBackend>,
        ttl: Duration,
        renewal: leasehold_core::Renewal,
    ) -> Result<Locker, Failure> {
        Locker::from_arc(Arc::clone(backend))
            .with_options(
                LockOptions::default()
                    .with_ttl(ttl)
                    .with_renewal(renewal)
                    .with_backoff(leasehold_core::Backoff {
                        initial: Duration::from_millis(2),
                        max: Duration::from_millis(50),
                    }),
            )
            .map_err(|e| Failure::new("setup", format!("locker options rejected: {e}")))
    }

    async fn expire(&self, lease: &Lease, ttl: Duration) {
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
    fn new(check: &'static str, message: impl Into<String>) -> Self {
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

macro_rules! ensure {
    ($check:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(Failure::new($check, format!($($msg)+)));
        }
    };
}

/// Turns an unexpected backend error into a failure of `check`.
fn op<T>(check: &'static str, what: &str, r: Result<T, Error>) -> Result<T, Failure> {
    r.map_err(|e| Failure::new(check, format!("{what}: unexpected error: {e}")))
}

/// A key unique to this run and check, so runs and checks never see each other's locks.
pub fn unique_key(check: &str) -> Result<LockKey, Failure> {
    let salt: u64 = rand::rng().random();
    let name: String = check.chars().take(64).collect();
    LockKey::new(format!("lh-conf-{salt:016x}-{name}"))
        .map_err(|e| Failure::new("setup", format!("bad test key: {e}")))
}

/// Every check, by name, in order.
pub const CHECKS: [&str; 8] = [
    "mutual_exclusion",
    "try_and_wait",
    "own_grant_only",
    "fencing_tokens",
    "validity_deadline",
    "watchdog",
    "cancellation",
    "bad_input",
];

/// Runs one check by name (see [`CHECKS`]).
pub async fn run(name: &str, t: &Target) -> Result<(), Failure> {
    match name {
        "mutual_exclusion" => mutual_exclusion(t).await,
        "try_and_wait" => try_and_wait(t).await,
        "own_grant_only" => own_grant_only(t).await,
        "fencing_tokens" => fencing_tokens(t).await,
        "validity_deadline" => validity_deadline(t).await,
        "watchdog" => watchdog(t).await,
        "cancellation" => cancellation(t).await,
        "bad_input" => bad_input(t).await,
        other => Err(Failure::new("run", format!("no check named {other:?}"))),
    }
}

/// Runs every check, stopping at the first failure.
pub async fn run_all(t: &Target) -> Result<(), Failure> {
    for name in CHECKS {
        run(name, t).await?;
    }
    Ok(())
}

/// 1. W workers × M increments of a shared, non-atomic counter under the lock, half through each
///    client: the total is exactly W×M, an overlap detector sees no two holders at once, and (for
///    backends that mint tokens) a fenced resource accepts every write.
pub async fn mutual_exclusion(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "mutual_exclusion";
    const WORKERS: usize = 5;
    const INCREMENTS: usize = 10;
    let key = unique_key(CHECK)?;
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let resource = Arc::new(FencedResource::new());
    let mints = t.caps().fencing.mints_tokens();
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let backend = if w % 2 == 0 { &t.primary } else { &t.other };
        let locker = t.locker(backend, t.long_ttl(), leasehold_core::Renewal::Auto)?;
        let (key, counter, inside, overlaps, resource) = (
            key.clone(),
            Arc::clone(&counter),
            Arc::clone(&inside),
            Arc::clone(&overlaps),
            Arc::clone(&resource),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..INCREMENTS {
                let lease = op(
                    CHECK,
                    "acquire",
                    locker.acquire(&key, Duration::from_secs(60)).await,
                )?;
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                if mints {
                    let token = lease.fencing_token().ok_or_else(|| {
                        Failure::new(CHECK, "backend declares fencing but gave no token")
                    })?;
                    if let Err(stale) = resource.write("counter", token) {
                        return Err(Failure::new(
                            CHECK,
                            format!("fenced write rejected under the lock: {stale:?}"),
                        ));
                    }
                }
                let v = counter.load(Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1)).await;
                counter.store(v + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                let held = op(CHECK, "release", lease.release().await)?;
                ensure!(
                    CHECK,
                    held,
                    "release said the lock was not held by its holder"
                );
            }
            Ok::<(), Failure>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure::new(CHECK, format!("worker panicked: {e}")))??;
    }
    let total = counter.load(Ordering::SeqCst);
    let overlaps = overlaps.load(Ordering::SeqCst);
    ensure!(CHECK, overlaps == 0, "{overlaps} overlapping holders seen");
    ensure!(
        CHECK,
        total == (WORKERS * INCREMENTS) as u64,
        "counter is {total}, expected {}",
        WORKERS * INCREMENTS
    );
    Ok(())
}

/// 2. `try_acquire` on a held key returns `Ok(None)` promptly; `acquire` with a budget waits and
///    succeeds after the holder releases; it times out cleanly when the holder never releases.
pub async fn try_and_wait(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "try_and_wait";
    let key = unique_key(CHECK)?;
    let l1 = t.locker(&t.primary, t.long_ttl(), leasehold_core::Renewal::Auto)?;
    let l2 = t.locker(&t.other, t.long_ttl(), leasehold_core::Renewal::Auto)?;

    let a = op(CHECK, "try_acquire", l1.try_acquire(&key).await)?
        .ok_or_else(|| Failure::new(CHECK, "a free key was not granted"))?;
    let t0 = Instant::now();
    let second = op(CHECK, "try_acquire (held)", l2.try_acquire(&key).await)?;
    ensure!(
        CHECK,
        second.is_none(),
        "a held key was granted to another client"
    );
    ensure!(
        CHECK,
        t0.elapsed() < Duration::from_secs(2),
        "try_acquire on a held key took {:?}",
        t0.elapsed()
    );

    let waiter = {
        let (l2, key) = (l2.clone(), key.clone());
        tokio::spawn(async move {
            let r = l2.acquire(&key, Duration::from_secs(20)).await;
            (r, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    ensure!(
        CHECK,
        !waiter.is_finished(),
        "the waiter finished while the lock was held"
    );
    let released_at = Instant::now();
    ensure!(
        CHECK,
        op(CHECK, "release", a.release().await)?,
        "release of a held lock said not held"
    );
    let (got, got_at) = waiter
        .await
        .map_err(|e| Failure::new(CHECK, format!("waiter panicked: {e}")))?;
    let b = op(CHECK, "acquire (waiting)", got)?;
    ensure!(
        CHECK,
        got_at >= released_at,
        "the waiter got the lock before it was released"
    );
    op(CHECK, "release", b.release().await)?;

    let holder = op(CHECK, "try_acquire", l1.try_acquire(&key).await)?
        .ok_or_else(|| Failure::new(CHECK, "a released key was not granted again"))?;
    let budget = Duration::from_millis(500);
    let t0 = Instant::now();
    let timed_out = l2.acquire(&key, budget).await;
    let elapsed = t0.elapsed();
    match timed_out {
        Ok(_) => return Err(Failure::new(CHECK, "acquire succeeded on a held key")),
        Err(e) => {
            ensure!(
                CHECK,
                e.kind() == ErrorKind::Timeout,
                "expected a timeout, got {e}"
            );
            ensure!(
                CHECK,
                e.attempts().is_some_and(|n| n >= 1),
                "the timeout does not report attempts: {e}"
            );
        }
    }
    ensure!(
        CHECK,
        elapsed >= budget - Duration::from_millis(5) && elapsed < budget + Duration::from_secs(3),
        "gave up after {elapsed:?} with a budget of {budget:?}"
    );
    ensure!(
        CHECK,
        op(CHECK, "release", holder.release().await)?,
        "holder lost the lock while another client waited"
    );
    Ok(())
}

/// 3. Release and extend act only on our own grant: after our grant lapses and another client
///    acquires, our release says "not held" and their lock survives; our extend fails; our lost
///    signal has fired; a fenced write with our old token is rejected after theirs.
pub async fn own_grant_only(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "own_grant_only";
    let key = unique_key(CHECK)?;
    let caps = t.caps();
    let l1 = t.locker(&t.primary, t.short_ttl, leasehold_core::Renewal::Off)?;
    let l2 = t.locker(&t.other, t.long_ttl(), leasehold_core::Renewal::Auto)?;

    let a = op(CHECK, "try_acquire", l1.try_acquire(&key).await)?
        .ok_or_else(|| Failure::new(CHECK, "a free key was not granted"))?;
    t.expire(&a, t.short_ttl).await;
    let lost = tokio::time::timeout(Duration::from_secs(10), a.lost().wait()).await;
    ensure!(
        CHECK,
        lost.is_ok(),
        "the lost signal did not fire after the grant lapsed"
    );
    let b = op(
        CHECK,
        "acquire after expiry",
        l2.acquire(&key, Duration::from_secs(10)).await,
    )?;

    let ours = op(CHECK, "stale release", a.release().await)?;
    ensure!(
        CHECK,
        !ours,
        "our release said we held a lock that another client holds"
    );
    let probe = t.locker(&t.primary, t.long_ttl(), leasehold_core::Renewal::Off)?;
    let still = op(CHECK, "try_acquire (theirs)", probe.try_acquire(&key).await)?;
    ensure!(
        CHECK,
        still.is_none(),
        "our stale release deleted their lock"
    );

    let ext = a.extend(t.short_ttl).await;
    ensure!(
        CHECK,
        ext.as_ref().err().map(Error::kind) == Some(ErrorKind::LeaseLost),
        "extend of a lost lease did not fail with LeaseLost: {ext:?}"
    );
    if caps.renewal == RenewalKind::Extend {
        // Ask the backend itself, bypassing the lease's own bookkeeping.
        let held = Held::new(&key, a.owner(), a.fencing_token(), None);
        let raw = t
            .primary
            .extend(ExtendRequest::new(held, t.long_ttl(), Instant::now()))
            .await;
        ensure!(
            CHECK,
            matches!(raw, Ok(None)),
            "the backend extended a grant that is not ours: {raw:?}"
        );
        let still = op(CHECK, "try_acquire (theirs)", probe.try_acquire(&key).await)?;
        ensure!(
            CHECK,
            still.is_none(),
            "their lock vanished after our stale extend"
        );
    }
    let fired = tokio::time::timeout(Duration::from_millis(100), a.lost().wait()).await;
    ensure!(
        CHECK,
        fired.is_ok() && a.is_lost(),
        "the lost signal is not set"
    );

    if caps.fencing.mints_tokens() {
        let (ta, tb) = (a.fencing_token(), b.fencing_token());
        let (Some(ta), Some(tb)) = (ta, tb) else {
            return Err(Failure::new(CHECK, "a fencing backend gave no token"));
        };
        ensure!(
            CHECK,
            tb > ta,
            "the new holder's token {tb} is not above ours {ta}"
        );
        let resource = FencedResource::new();
        ensure!(
            CHECK,
            resource.write("r", tb).is_ok(),
            "the new holder's write was rejected"
        );
        ensure!(
            CHECK,
            resource.write("r", ta).is_err(),
            "our stale write was accepted after the new holder's"
        );
    }
    let theirs = op(CHECK, "release (theirs)", b.release().await)?;
    ensure!(
        CHECK,
        theirs,
        "their lock did not survive our stale release"
    );
    Ok(())
}

/// 4. Fencing tokens strictly increase across successive holders under contention, for a backend
///    that mints them; one that doesn't returns none, consistently.
pub async fn fencing_tokens(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "fencing_tokens";
    const WORKERS: usize = 4;
    const ROUNDS: usize = 5;
    let key = unique_key(CHECK)?;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        let backend = if w % 2 == 0 { &t.primary } else { &t.other };
        let locker = t.locker(backend, t.long_ttl(), leasehold_core::Renewal::Auto)?;
        let (key, seen) = (key.clone(), Arc::clone(&seen));
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let lease = op(
                    CHECK,
                    "acquire",
                    locker.acquire(&key, Duration::from_secs(60)).await,
                )?;
                seen.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(lease.fencing_token());
                tokio::task::yield_now().await;
                op(CHECK, "release", lease.release().await)?;
            }
            Ok::<(), Failure>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| Failure::new(CHECK, format!("worker panicked: {e}")))??;
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap_or_else(PoisonError::into_inner));
    ensure!(
        CHECK,
        seen.len() == WORKERS * ROUNDS,
        "only {} grants",
        seen.len()
    );
    if t.caps().fencing.mints_tokens() {
        let tokens: Option<Vec<u64>> = seen.iter().map(|t| t.map(|t| t.get())).collect();
        let tokens = tokens
            .ok_or_else(|| Failure::new(CHECK, "a fencing backend gave a grant without a token"))?;
        for pair in tokens.windows(2) {
            ensure!(
                CHECK,
                pair[0] < pair[1],
                "tokens do not strictly increase in grant order: {tokens:?}"
            );
        }
    } else {
        ensure!(
            CHECK,
            seen.iter().all(Option::is_none),
            "a backend that declares no fencing gave tokens: {seen:?}"
        );
    }
    Ok(())
}

/// 5. The validity deadline is never later than send instant + ttl − drift, on acquisition and
///    after extend, even when the answer is slow to arrive.
pub async fn validity_deadline(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "validity_deadline";
    let key = unique_key(CHECK)?;
    let sent_at = Arc::new(Mutex::new(None));
    let slow: Arc<dyn LockBackend> = Arc::new(SlowAnswers {
        inner: Arc::clone(&t.primary),
        sent_at: Arc::clone(&sent_at),
    });
    let sent_instant = || {
        sent_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .ok_or_else(|| Failure::new(CHECK, "no request was recorded"))
    };
    let ttl = t.long_ttl();
    let locker = t.locker(&slow, ttl, leasehold_core::Renewal::Off)?;
    let margin = locker.options().drift.margin(ttl);

    let lease = op(CHECK, "try_acquire", locker.try_acquire(&key).await)?
        .ok_or_else(|| Failure::new(CHECK, "a free key was not granted"))?;
    let sent = sent_instant()?;
    ensure!(
        CHECK,
        lease.valid_until() <= sent + ttl - margin,
        "deadline {:?} after send + ttl − drift ({:?}): counted from the answer, not the request?",
        lease.valid_until() - sent,
        ttl - margin
    );
    ensure!(CHECK, !lease.is_lost(), "a fresh lease is already lost");

    op(CHECK, "extend", lease.extend(ttl).await)?;
    let sent = sent_instant()?;
    ensure!(
        CHECK,
        lease.valid_until() <= sent + ttl - margin,
        "deadline after extend is {:?} past the send instant; at most {:?} allowed",
        lease.valid_until() - sent,
        ttl - margin
    );
    op(CHECK, "release", lease.release().await)?;
    Ok(())
}

/// Forwards to a backend, recording when each request was sent and delaying each answer, so a
/// deadline counted from the answer instead of the request shows.
#[derive(Debug)]
struct SlowAnswers {
    inner: Arc<dyn LockBackend>,
    sent_at: Arc<Mutex<Option<Instant>>>,
}

impl SlowAnswers {
    const DELAY: Duration = Duration::from_millis(150);

    fn record(&self) {
        *self.sent_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }
}

#[async_trait]
impl LockBackend for SlowAnswers {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.record();
        let r = self.inner.try_lock(req).await;
        tokio::time::sleep(Self::DELAY).await;
        r
    }
    async fn wait_lock(&self, req: LockRequest<'_>, deadline: Instant) -> Result<Waited, Error> {
        self.record();
        let r = self.inner.wait_lock(req, deadline).await;
        tokio::time::sleep(Self::DELAY).await;
        r
    }
    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        self.inner.release(held).await
    }
    async fn extend(&self, req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        self.record();
        let r = self.inner.extend(req).await;
        tokio::time::sleep(Self::DELAY).await;
        r
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.inner.inspect(key).await
    }
}

/// 6. The watchdog keeps a lease alive across 5× its TTL while another client keeps trying; when
///    renewal stops, the lease's deadline passes (and its lost signal fires) before the other
///    client can acquire. Session-renewed backends must simply keep the lease for 5× the TTL.
pub async fn watchdog(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "watchdog";
    let key = unique_key(CHECK)?;
    let ttl = t.short_ttl;
    let l1 = t.locker(&t.primary, ttl, leasehold_core::Renewal::Auto)?;
    let l2 = t.locker(&t.other, t.long_ttl(), leasehold_core::Renewal::Off)?;
    let a = op(CHECK, "try_acquire", l1.try_acquire(&key).await)?
        .ok_or_else(|| Failure::new(CHECK, "a free key was not granted"))?;
    let end = Instant::now() + ttl * 5;
    while Instant::now() < end {
        tokio::time::sleep(ttl / 2).await;
        let other = op(CHECK, "try_acquire (other)", l2.try_acquire(&key).await)?;
        ensure!(
            CHECK,
            other.is_none(),
            "another client acquired a renewed lease"
        );
        ensure!(
            CHECK,
            !a.is_lost(),
            "a renewed lease was lost: {:?}",
            a.loss_reason()
        );
    }
    if t.caps().renewal != RenewalKind::Extend {
        ensure!(
            CHECK,
            op(CHECK, "release", a.release().await)?,
            "lease not held at the end"
        );
        return Ok(());
    }
    a.stop_renewal();
    let give_up = Instant::now() + ttl * 10 + Duration::from_secs(5);
    let (b, got_at) = loop {
        if let Some(b) = op(CHECK, "try_acquire (other)", l2.try_acquire(&key).await)? {
            break (b, Instant::now());
        }
        ensure!(
            CHECK,
            Instant::now() < give_up,
            "the unrenewed lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    ensure!(
        CHECK,
        a.valid_until() <= got_at && a.is_lost(),
        "another client acquired {:?} before our deadline",
        a.valid_until().saturating_duration_since(got_at)
    );
    let fired = tokio::time::timeout(Duration::from_millis(100), a.lost().wait()).await;
    ensure!(CHECK, fired.is_ok(), "the lost signal did not complete");
    op(CHECK, "release", b.release().await)?;
    Ok(())
}

/// 7. 1,000 acquire futures dropped at random points (before the first poll, mid-request,
///    mid-wait, right after the grant) while another task churns the lock; afterwards the backend
///    holds nothing and the key is acquirable at once.
pub async fn cancellation(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "cancellation";
    const DROPS: usize = 1_000;
    let key = unique_key(CHECK)?;
    let l1 = t.locker(&t.primary, t.long_ttl(), leasehold_core::Renewal::Auto)?;
    let l2 = t.locker(&t.other, t.long_ttl(), leasehold_core::Renewal::Auto)?;
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (l1, key, stop) = (l1.clone(), key.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Ok(Some(lease)) = l1.try_acquire(&key).await {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    let _ = lease.release().await;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };
    let waker = Waker::noop();
    for i in 0..DROPS {
        let locker = if i % 2 == 0 { &l1 } else { &l2 };
        let (mode, polls, micros) = {
            let mut rng = rand::rng();
            (
                rng.random_range(0..4u8),
                rng.random_range(0..4usize),
                rng.random_range(0..3_000u64),
            )
        };
        match mode {
            0 => poll_then_drop(locker.try_acquire(&key), polls, waker),
            1 => poll_then_drop(
                locker.acquire(&key, Duration::from_millis(50)),
                polls,
                waker,
            ),
            2 => {
                let _ = tokio::time::timeout(
                    Duration::from_micros(micros),
                    locker.acquire(&key, Duration::from_millis(20)),
                )
                .await;
            }
            _ => {
                let _ =
                    tokio::time::timeout(Duration::from_micros(micros), locker.try_acquire(&key))
                        .await;
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    churn
        .await
        .map_err(|e| Failure::new(CHECK, format!("churn task panicked: {e}")))?;

    let settle_by = Instant::now() + t.settle;
    // Background clean-ups may still be landing: nothing must be held for a few samples in a
    // row, not just once.
    let mut quiet = 0;
    loop {
        let held = match &t.held {
            Some(hook) => op(CHECK, "held hook", hook().await)?,
            None => usize::from(op(CHECK, "inspect", t.primary.inspect(&key).await)?.is_some()),
        };
        if held == 0 {
            quiet += 1;
            if quiet == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        quiet = 0;
        ensure!(
            CHECK,
            Instant::now() < settle_by,
            "{held} grant(s) still held {:?} after the last dropped acquire",
            t.settle
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t0 = Instant::now();
    let lease = op(CHECK, "try_acquire", l2.try_acquire(&key).await)?;
    ensure!(
        CHECK,
        lease.is_some(),
        "the key is still held after the drops settled"
    );
    ensure!(
        CHECK,
        t0.elapsed() < Duration::from_secs(1),
        "try_acquire took {:?}",
        t0.elapsed()
    );
    Ok(())
}

/// Polls `fut` up to `polls` times with a waker that does nothing, then drops it wherever it is.
fn poll_then_drop<F: Future>(fut: F, polls: usize, waker: &Waker) {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(waker);
    for _ in 0..polls {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            drop(out);
            return;
        }
    }
}

/// 8. Empty, oversized and NUL keys; a zero TTL, a TTL below the drift margin and an absurd TTL:
///    typed errors, no panic.
pub async fn bad_input(t: &Target) -> Result<(), Failure> {
    const CHECK: &str = "bad_input";
    let locker = t.locker(&t.primary, t.long_ttl(), leasehold_core::Renewal::Off)?;
    let long = "k".repeat(leasehold_core::MAX_KEY_LEN + 1);
    for (bad, want) in [
        ("", KeyError::Empty),
        (
            long.as_str(),
            KeyError::TooLong {
                len: long.len(),
                max: leasehold_core::MAX_KEY_LEN,
            },
        ),
        ("a\0b", KeyError::ContainsNul { offset: 1 }),
    ] {
        for r in [
            locker.try_acquire(bad).await.map(|_| ()),
            locker
                .acquire(bad, Duration::from_millis(10))
                .await
                .map(|_| ()),
            locker.inspect(bad).await.map(|_| ()),
        ] {
            let e = r.err();
            ensure!(
                CHECK,
                e.as_ref().map(Error::kind) == Some(ErrorKind::InvalidKey)
                    && e.as_ref().and_then(Error::key_error) == Some(&want),
                "key {:?}: expected InvalidKey({want:?}), got {e:?}",
                bad.get(..20).unwrap_or(bad)
            );
        }
    }
    let caps = t.caps();
    let base = Locker::from_arc(Arc::clone(&t.primary));
    for ttl in [
        Duration::ZERO,
        Duration::from_millis(2),
        caps.max_ttl + Duration::from_secs(1),
        Duration::from_secs(100 * 365 * 86_400),
        Duration::MAX,
    ] {
        let r = base.clone().with_ttl(ttl);
        ensure!(
            CHECK,
            r.as_ref().err().map(Error::kind) == Some(ErrorKind::InvalidArgument),
            "ttl {ttl:?} was not rejected as an invalid argument"
        );
    }
    let key = unique_key(CHECK)?;
    let lease = op(CHECK, "try_acquire", locker.try_acquire(&key).await)?
        .ok_or_else(|| Failure::new(CHECK, "a free key was not granted"))?;
    for ttl in [Duration::ZERO, Duration::MAX] {
        let r = lease.extend(ttl).await;
        ensure!(
            CHECK,
            r.as_ref().err().map(Error::kind) == Some(ErrorKind::InvalidArgument),
            "extend({ttl:?}) was not rejected as an invalid argument: {r:?}"
        );
    }
    ensure!(
        CHECK,
        op(CHECK, "release", lease.release().await)?,
        "bad extends broke the lease"
    );
    Ok(())
}

/// Generates one `#[tokio::test]` per conformance check.
///
/// `$target` is the path of an `async fn() -> Option<Target>`; returning `None` skips (which
/// [`services::require`](crate::services) only allows outside CI).
#[macro_export]
macro_rules! conformance_tests {
    ($target:path) => {
        $crate::conformance_tests!(@each $target;
            mutual_exclusion, try_and_wait, own_grant_only, fencing_tokens,
            validity_deadline, watchdog, cancellation, bad_input);
    };
    (@each $target:path; $($check:ident),+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let Some(target) = $target().await else { return };
                if let Err(failure) = $crate::conformance::$check(&target).await {
                    panic!("{failure}");
                }
            }
        )+
    };
}
