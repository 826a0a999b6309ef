//! Releases that absorb transient faults: retried in the foreground within a bound, then in
//! the background until the lock is gone.
//!
//! A release is a compare-and-delete on our owner value, so sending it again is always safe.
//! [`retry_release`] retries it while it fails with a retryable error ([`Error::is_retryable`]:
//! a server that answers "too many requests", "busy" or "loading", a timeout, a dropped
//! connection) within a time budget; [`release_in_background`] keeps trying after that, until
//! the backend confirms, answers with an error that cannot be transient, or the lock has
//! expired on the server by itself (the [`Horizon`]). [`Lease`](crate::Lease),
//! [`Locker`](crate::Locker) and backends that release on their own (a backend giving back a
//! grant nobody took) use the same two functions.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::backend::{Held, LockBackend, LockBackendExt};
use crate::caps::{Capabilities, RenewalKind};
use crate::detach::spawn_detached;
use crate::error::{Error, ErrorKind};
use crate::metrics;
use crate::policy::{Backoff, Drift};

/// How long [`Lease::release`](crate::Lease::release) keeps retrying a release that fails with
/// a transient fault before it returns the error and leaves the release to the background.
pub const RELEASE_BUDGET: Duration = Duration::from_secs(5);

/// Delays between foreground retries: fully jittered, so that thousands of releases refused
/// together do not come back together.
const FOREGROUND: Backoff = Backoff {
    initial: Duration::from_millis(10),
    max: Duration::from_millis(500),
};

/// Delays between background retries (and the longest a background attempt may take).
const BACKGROUND: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(5),
};

/// How many release calls of one backend a [`ReleaseGate::default`] lets be in flight at once.
///
/// Enough to keep a server's pipeline full, few enough that a burst's requests do not all
/// exist at once: each costs the client a few KiB while in flight (a Redlock release sends one
/// request per node). The fleet benchmark's burst release of 10,000 leases shows both (its
/// release time, and the peak of its resident memory).
pub const RELEASES_IN_FLIGHT: usize = 256;

/// The setting of a backend's [`ReleaseGate`] size, the same in every driver's URL and
/// configuration: `releases_in_flight=N`, at least 1, default [`RELEASES_IN_FLIGHT`].
pub const RELEASES_IN_FLIGHT_OPTION: &str = "releases_in_flight";

/// Bounds the release calls of one backend in flight: the others wait their turn, first come
/// first served, before their request is built. A backend that talks to a server keeps one and
/// returns it from [`LockBackend::release_gate`]; [`Lease::release`](crate::Lease::release),
/// the releases of dropped leases and the clean-up of abandoned acquisitions all pass through
/// it. The wait counts within the caller's release budget, as the request would: a server that
/// does not answer holds every place until the calls' bounds, and the releases behind them end
/// at their budget as they would have (then go on in the background).
#[derive(Debug)]
pub struct ReleaseGate {
    places: tokio::sync::Semaphore,
    size: usize,
}

impl ReleaseGate {
    /// A gate of `limit` places (at least one, at most [`tokio::sync::Semaphore::MAX_PERMITS`]).
    pub fn new(limit: usize) -> Self {
        let size = limit.clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        Self {
            places: tokio::sync::Semaphore::new(size),
            size,
        }
    }

    /// Its number of places.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Checks a size configured for `backend`'s gate ([`RELEASES_IN_FLIGHT_OPTION`]): an
    /// `InvalidConfig` error for 0 (no release could ever be sent) or for more places than a
    /// gate can have.
    pub fn check_size(backend: &'static str, size: usize) -> Result<usize, Error> {
        if (1..=tokio::sync::Semaphore::MAX_PERMITS).contains(&size) {
            return Ok(size);
        }
        Err(Error::new(
            ErrorKind::InvalidConfig,
            backend,
            format!(
                "{RELEASES_IN_FLIGHT_OPTION}={size}: the release calls in flight must be \
                 between 1 and {}",
                tokio::sync::Semaphore::MAX_PERMITS
            ),
        ))
    }

    /// [`check_size`](Self::check_size) of a size given as text (a URL option).
    pub fn parse_size(backend: &'static str, text: &str) -> Result<usize, Error> {
        let size = text.parse().map_err(|_| {
            Error::new(
                ErrorKind::InvalidConfig,
                backend,
                format!("{RELEASES_IN_FLIGHT_OPTION}={text:?} is not a whole number"),
            )
        })?;
        Self::check_size(backend, size)
    }

    /// Makes the call `release` builds once a place is free, holding the place until it ends;
    /// a call that has to wait counts in [`metrics::RELEASE_WAITS`] for `backend`.
    pub async fn call<F, Fut, T>(&self, backend: &'static str, release: F) -> T
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        // A free place exists only while nobody waits (a place given back goes to the first
        // waiter), so taking one at once keeps the order. The semaphore is never closed; were
        // it closed, the call would simply go ahead unbounded.
        let _place = match self.places.try_acquire() {
            Ok(place) => Some(place),
            Err(_) => {
                metrics::release_waited(backend);
                self.places.acquire().await.ok()
            }
        };
        release().await
    }
}

impl Default for ReleaseGate {
    /// A gate of [`RELEASES_IN_FLIGHT`] places.
    fn default() -> Self {
        Self::new(RELEASES_IN_FLIGHT)
    }
}

/// `backend.release(held)`, through the backend's [`ReleaseGate`] if it has one.
pub(crate) async fn gated_release(
    backend: &dyn LockBackend,
    held: Held<'_>,
) -> Result<bool, Error> {
    match backend.release_gate() {
        Some(gate) => gate.call(backend.name(), || backend.release(held)).await,
        None => backend.release(held).await,
    }
}

/// How long a background release keeps trying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Horizon {
    /// Until the backend confirms or says the grant is gone. For backends whose grants live as
    /// long as a session ([`RenewalKind::Session`]): such a backend answers `Ok(false)` once the
    /// session that carried the grant is gone, and that ends the retries.
    Confirmed,
    /// Until this instant at the latest: the grant has expired on the server by then (a TTL
    /// counted from a request sent before the horizon's start).
    Expires(Instant),
}

impl Horizon {
    /// The horizon of a grant on a backend with `caps`, last armed for `ttl` by a request sent
    /// no later than `armed`: TTL backends stop once that TTL (plus the drift margin) has
    /// passed, session backends only when the backend confirms.
    pub fn of(caps: &Capabilities, armed: Instant, ttl: Duration, drift: &Drift) -> Self {
        match caps.renewal {
            RenewalKind::Extend => armed
                .checked_add(ttl + drift.margin(ttl))
                .map_or(Self::Confirmed, Self::Expires),
            RenewalKind::Session => Self::Confirmed,
        }
    }

    fn passed_by(self, at: Instant) -> bool {
        matches!(self, Self::Expires(h) if at >= h)
    }
}

/// Calls `release` until it answers, fails with an error that is not retryable, or `budget`
/// has passed (counting every attempt's own time: an attempt still unanswered at the end of
/// the budget is dropped and counts as `Unavailable`). Retries wait a capped, fully jittered
/// backoff and are counted in [`metrics::RELEASE_RETRIES`]. Returns the last outcome: on
/// `Err`, [`Error::is_retryable`] says whether the fault was transient (then hand the release
/// to [`release_in_background`]).
pub async fn retry_release<F, Fut>(
    backend: &'static str,
    budget: Duration,
    mut release: F,
) -> Result<bool, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, Error>>,
{
    let started = Instant::now();
    let deadline = started.checked_add(budget).unwrap_or(started);
    let mut retry = 0u32;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let outcome = match tokio::time::timeout(left, release()).await {
            Ok(r) => r,
            Err(_) => Err(unanswered(backend, budget)),
        };
        let e = match outcome {
            Err(e) if e.is_retryable() => e,
            done => return done,
        };
        retry += 1;
        let delay = FOREGROUND.delay(retry);
        if Instant::now() + delay >= deadline {
            return Err(e);
        }
        metrics::release_retried(backend);
        tracing::debug!(error = %e, retry, "leasehold.release: transient fault; retrying");
        tokio::time::sleep(delay).await;
    }
}

/// Keeps calling `release` in a background task on the current Tokio runtime until it
/// answers, fails with an error that is not retryable, or `horizon` has passed; retries wait a
/// capped, fully jittered backoff (up to 5 s). The task is counted by
/// [`settle`](crate::settle). `handed_over` says that a foreground call already failed (the
/// release counts at once in [`metrics::RELEASES_BACKGROUNDED`]; otherwise it counts there
/// only if its first attempt fails). Returns `false` if there is no runtime to run it on.
pub fn release_in_background<F, Fut>(
    backend: &'static str,
    horizon: Horizon,
    handed_over: bool,
    release: F,
) -> bool
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Result<bool, Error>> + Send + 'static,
{
    if handed_over {
        metrics::release_backgrounded(backend);
    }
    let span = tracing::debug_span!("leasehold.release.background", backend);
    spawn_detached(background(backend, horizon, handed_over, release).instrument(span))
}

async fn background<F, Fut>(backend: &'static str, horizon: Horizon, counted: bool, mut release: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, Error>>,
{
    let mut retry = 0u32;
    loop {
        let outcome = match tokio::time::timeout(BACKGROUND.max, release()).await {
            Ok(r) => r,
            Err(_) => Err(unanswered(backend, BACKGROUND.max)),
        };
        let e = match outcome {
            Ok(held) => {
                tracing::debug!(held, retries = retry, "leasehold.release: done");
                return;
            }
            Err(e) if !e.is_retryable() => {
                metrics::release_given_up(backend, "error");
                tracing::warn!(error = %e,
                    "leasehold.release: a fault that retrying cannot fix; the grant ends by its \
                     TTL or session");
                return;
            }
            Err(e) => e,
        };
        if retry == 0 && !counted {
            metrics::release_backgrounded(backend);
        }
        retry += 1;
        let delay = BACKGROUND.delay(retry);
        if horizon.passed_by(Instant::now() + delay) {
            metrics::release_given_up(backend, "expired");
            tracing::debug!(error = %e, "leasehold.release: stopped; the grant has expired by its TTL");
            return;
        }
        metrics::release_retried(backend);
        tracing::debug!(error = %e, retry, "leasehold.release: transient fault; retrying in the background");
        tokio::time::sleep(delay).await;
    }
}

fn unanswered(backend: &'static str, limit: Duration) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        backend,
        format!("release: no answer within {limit:?}"),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    /// A release that fails `fails` times with `kind`, then answers `Ok(true)`; counts calls.
    fn flaky(
        kind: ErrorKind,
        fails: u32,
    ) -> (
        Arc<AtomicU32>,
        impl FnMut() -> std::future::Ready<Result<bool, Error>> + Send + 'static,
    ) {
        let calls = Arc::new(AtomicU32::new(0));
        let c = Arc::clone(&calls);
        (calls, move || {
            let n = c.fetch_add(1, Ordering::AcqRel);
            std::future::ready(if n < fails {
                Err(Error::new(kind, "test", "refused"))
            } else {
                Ok(true)
            })
        })
    }

    #[tokio::test(start_paused = true)]
    async fn transient_faults_are_retried_within_the_budget() {
        let (calls, op) = flaky(ErrorKind::Unavailable, 5);
        assert!(retry_release("test", RELEASE_BUDGET, op).await.unwrap());
        assert_eq!(calls.load(Ordering::Acquire), 6);
    }

    #[tokio::test(start_paused = true)]
    async fn faults_that_cannot_be_transient_are_not_retried() {
        let (calls, op) = flaky(ErrorKind::Backend, 5);
        let e = retry_release("test", RELEASE_BUDGET, op).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Backend);
        assert_eq!(calls.load(Ordering::Acquire), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_release_ends_at_the_budget_then_the_background_finishes_it() {
        let t0 = Instant::now();
        let hang = || std::future::pending::<Result<bool, Error>>();
        let e = retry_release("test", RELEASE_BUDGET, hang)
            .await
            .unwrap_err();
        assert!(e.is_retryable());
        assert_eq!(Instant::now() - t0, RELEASE_BUDGET);

        let (calls, op) = flaky(ErrorKind::Unavailable, 20);
        assert!(release_in_background("test", Horizon::Confirmed, true, op));
        // Not `settle`: its count is process-wide, and sibling tests' background releases
        // (on their own runtimes and clocks) would hold it up while this paused clock jumps.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(
            calls.load(Ordering::Acquire),
            21,
            "retried until it answered"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_background_release_stops_at_its_horizon() {
        let t0 = Instant::now();
        let last = Arc::new(std::sync::Mutex::new(t0));
        let (calls, mut op) = flaky(ErrorKind::Unavailable, u32::MAX);
        let seen = Arc::clone(&last);
        let op = move || {
            *seen.lock().unwrap() = Instant::now();
            op()
        };
        let horizon = Horizon::Expires(t0 + Duration::from_secs(30));
        assert!(release_in_background("test", horizon, false, op));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        let n = calls.load(Ordering::Acquire);
        assert!(n > 5, "retried: {n} calls");
        assert!(*last.lock().unwrap() < t0 + Duration::from_secs(30));
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert_eq!(calls.load(Ordering::Acquire), n, "stopped at the horizon");
    }

    /// A configured size is checked, and a gate has the places it was given (at least one).
    #[test]
    fn gate_sizes_are_checked() {
        assert_eq!(ReleaseGate::new(5).size(), 5);
        assert_eq!(ReleaseGate::new(0).size(), 1);
        assert_eq!(ReleaseGate::default().size(), RELEASES_IN_FLIGHT);
        assert_eq!(ReleaseGate::parse_size("x", "12").ok(), Some(12));
        for bad in ["0", "-1", "many", ""] {
            let e = ReleaseGate::parse_size("x", bad).err();
            assert_eq!(e.as_ref().map(Error::kind), Some(ErrorKind::InvalidConfig));
            assert!(e.is_some_and(|e| e.to_string().contains(RELEASES_IN_FLIGHT_OPTION)));
        }
    }
}
