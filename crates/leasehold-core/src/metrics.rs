//! Metrics through the [`metrics`](https://docs.rs/metrics) facade (the `metrics` feature).
//!
//! With the feature on, [`Locker`](crate::Locker) and [`Lease`](crate::Lease) record the
//! metrics below into whatever recorder the application installed (a Prometheus exporter, for
//! example; with none installed, recording does nothing). With the feature off, nothing is
//! compiled in: the recording calls are empty functions. The names are constants here so that
//! code reading the metrics back does not repeat string literals.
//!
//! | name | type | labels | what it counts |
//! |---|---|---|---|
//! | `leasehold_acquire_seconds` | histogram | `backend`, `outcome` | duration of each `try_acquire` / `acquire` call; `outcome` is `acquired`, `contended` (held elsewhere: `try_acquire` only), `timeout` (the wait budget ran out) or `error` |
//! | `leasehold_acquire_attempts_total` | counter | `backend` | requests sent to the backend to take a lock (a waiting `acquire` makes several; a native wait counts what the backend reports) |
//! | `leasehold_contended_total` | counter | `backend` | attempts that found the lock held by someone else |
//! | `leasehold_acquire_timeouts_total` | counter | `backend` | `acquire` calls whose wait budget ran out |
//! | `leasehold_leases_lost_total` | counter | `backend`, `reason` | leases lost before their holder let go: `reason` is `expired` (the validity deadline passed unrenewed), `not_held` (the backend no longer had the grant), `renewal_failed` or `backend` (the backend reported the loss: a dead session, a revoked lease) |
//! | `leasehold_leases_held` | gauge | `backend` | leases granted to this process and not yet released or dropped (a lost lease counts until its holder drops it) |
//! | `leasehold_renewal_failures_total` | counter | `backend` | renewals (watchdog or [`Lease::extend`](crate::Lease::extend)) that failed with a fault; the lease stays valid until its deadline |
//! | `leasehold_release_retries_total` | counter | `backend` | release attempts sent again after a transient fault (a server that said "too many requests", "busy" or "loading", a timeout, a dropped connection), in a `release()` call or in the background |
//! | `leasehold_releases_backgrounded_total` | counter | `backend` | releases left to the background retrier after a transient fault: a `release()` call out of its budget, or the release of a dropped lease or an abandoned acquisition whose first attempt failed |
//! | `leasehold_releases_given_up_total` | counter | `backend`, `reason` | background releases that stopped without an answer: `reason` is `expired` (the grant's TTL has passed on the server, so it is gone anyway) or `error` (a fault that retrying cannot fix; the grant ends by its TTL or session). Never `expired` for a backend whose grants live with a session while that session lives |
//! | `leasehold_release_waits_total` | counter | `backend` | releases that found the backend's release gate full (its calls in flight: [`RELEASES_IN_FLIGHT`](crate::RELEASES_IN_FLIGHT) unless the backend's `releases_in_flight` sets another bound) and waited their turn: a burst of releases larger than the gate |
//! | `leasehold_renewal_batch_size` | histogram | `backend` | leases renewed together in one batch of the renewal engine (one `extend_many` call) |
//! | `leasehold_renewal_batch_seconds` | histogram | `backend` | duration of each renewal batch, from before it was sent to its last answer |
//! | `leasehold_renewal_batch_failures_total` | counter | `backend` | renewal batches in which at least one lease got a fault (a batch that failed or timed out as a whole counts once) |
//! | `leasehold_pool_sessions` | gauge | `backend` | server sessions (connections) a backend's bounded pool has open or is opening (PostgreSQL: at most `max_sessions`) |
//! | `leasehold_pool_waiters` | gauge | `backend` | requests waiting for a session of a full pool |
//! | `leasehold_pool_wait_seconds` | histogram | `backend` | how long each request that found the pool full waited for a session (whether it got one or not) |
//! | `leasehold_requests_total` | counter | `route`, `outcome` | recorded by `leasehold-tower`'s `LockLayer`: one per request, see its documentation |
//!
//! `backend` is the backend's name (`memory`, `redis`, `redlock`, `postgres`, `etcd`, `file`,
//! …). Call `describe()` (with the feature on) once after installing the recorder to register
//! units and help texts.

/// Histogram: seconds per `try_acquire` / `acquire` call, by `backend` and `outcome`.
pub const ACQUIRE_SECONDS: &str = "leasehold_acquire_seconds";
/// Counter: attempts sent to the backend, by `backend`.
pub const ACQUIRE_ATTEMPTS: &str = "leasehold_acquire_attempts_total";
/// Counter: attempts that found the lock held elsewhere, by `backend`.
pub const CONTENDED: &str = "leasehold_contended_total";
/// Counter: `acquire` calls that ran out of wait budget, by `backend`.
pub const ACQUIRE_TIMEOUTS: &str = "leasehold_acquire_timeouts_total";
/// Counter: leases lost before release, by `backend` and `reason`.
pub const LEASES_LOST: &str = "leasehold_leases_lost_total";
/// Gauge: leases held (granted, not yet released or dropped), by `backend`.
pub const LEASES_HELD: &str = "leasehold_leases_held";
/// Counter: renewals that failed with a fault, by `backend`.
pub const RENEWAL_FAILURES: &str = "leasehold_renewal_failures_total";
/// Counter: release attempts sent again after a transient fault, by `backend`.
pub const RELEASE_RETRIES: &str = "leasehold_release_retries_total";
/// Counter: releases left to the background retrier, by `backend`.
pub const RELEASES_BACKGROUNDED: &str = "leasehold_releases_backgrounded_total";
/// Counter: background releases that stopped without an answer, by `backend` and `reason`.
pub const RELEASES_GIVEN_UP: &str = "leasehold_releases_given_up_total";
/// Counter: releases that waited for a place at the backend's release gate, by `backend`.
pub const RELEASE_WAITS: &str = "leasehold_release_waits_total";
/// Histogram: leases per renewal batch, by `backend`.
pub const RENEWAL_BATCH_SIZE: &str = "leasehold_renewal_batch_size";
/// Histogram: seconds per renewal batch, by `backend`.
pub const RENEWAL_BATCH_SECONDS: &str = "leasehold_renewal_batch_seconds";
/// Counter: renewal batches with at least one fault, by `backend`.
pub const RENEWAL_BATCH_FAILURES: &str = "leasehold_renewal_batch_failures_total";
/// Gauge: sessions a backend's pool has open or is opening, by `backend`.
pub const POOL_SESSIONS: &str = "leasehold_pool_sessions";
/// Gauge: requests waiting for a session of a full pool, by `backend`.
pub const POOL_WAITERS: &str = "leasehold_pool_waiters";
/// Histogram: seconds a request waited for a session of a full pool, by `backend`.
pub const POOL_WAIT_SECONDS: &str = "leasehold_pool_wait_seconds";
/// Counter: requests through `leasehold-tower`'s `LockLayer`, by `route` and `outcome`.
pub const REQUESTS: &str = "leasehold_requests_total";

#[cfg(feature = "metrics")]
use crate::error::ErrorKind;
#[cfg(feature = "metrics")]
use crate::loss::LossReason;

/// Registers the unit and help text of every metric with the installed recorder (the
/// Prometheus exporter prints them as `# HELP` lines). Needs the `metrics` feature.
#[cfg(feature = "metrics")]
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(
        ACQUIRE_SECONDS,
        Unit::Seconds,
        "Duration of lock acquisitions, by backend and outcome"
    );
    describe_counter!(
        ACQUIRE_ATTEMPTS,
        Unit::Count,
        "Lock attempts sent to the backend"
    );
    describe_counter!(
        CONTENDED,
        Unit::Count,
        "Lock attempts that found the lock held elsewhere"
    );
    describe_counter!(
        ACQUIRE_TIMEOUTS,
        Unit::Count,
        "Acquisitions whose wait budget ran out"
    );
    describe_counter!(
        LEASES_LOST,
        Unit::Count,
        "Leases lost before their holder let go, by reason"
    );
    describe_gauge!(
        LEASES_HELD,
        Unit::Count,
        "Leases granted and not yet released"
    );
    describe_counter!(
        RENEWAL_FAILURES,
        Unit::Count,
        "Lease renewals that failed with a fault"
    );
    describe_histogram!(
        RENEWAL_BATCH_SIZE,
        Unit::Count,
        "Leases renewed together in one batch"
    );
    describe_histogram!(
        RENEWAL_BATCH_SECONDS,
        Unit::Seconds,
        "Duration of renewal batches"
    );
    describe_counter!(
        RENEWAL_BATCH_FAILURES,
        Unit::Count,
        "Renewal batches in which a lease got a fault"
    );
    describe_counter!(
        RELEASE_RETRIES,
        Unit::Count,
        "Release attempts sent again after a transient fault"
    );
    describe_counter!(
        RELEASES_BACKGROUNDED,
        Unit::Count,
        "Releases left to the background retrier after a transient fault"
    );
    describe_counter!(
        RELEASES_GIVEN_UP,
        Unit::Count,
        "Background releases that stopped without an answer, by reason"
    );
    describe_counter!(
        RELEASE_WAITS,
        Unit::Count,
        "Releases that waited for a place at the backend's release gate"
    );
    describe_gauge!(
        POOL_SESSIONS,
        Unit::Count,
        "Server sessions the backend's pool has open or is opening"
    );
    describe_gauge!(
        POOL_WAITERS,
        Unit::Count,
        "Requests waiting for a session of a full pool"
    );
    describe_histogram!(
        POOL_WAIT_SECONDS,
        Unit::Seconds,
        "Time requests waited for a session of a full pool"
    );
    describe_counter!(
        REQUESTS,
        Unit::Count,
        "Requests through LockLayer, by route and outcome"
    );
}

/// One request to the backend: `attempts` sent, `contended` of them found the lock held.
#[inline(always)]
pub(crate) fn attempted(backend: &'static str, attempts: u32, contended: u32) {
    #[cfg(feature = "metrics")]
    {
        metrics::counter!(ACQUIRE_ATTEMPTS, "backend" => backend).increment(u64::from(attempts));
        if contended > 0 {
            metrics::counter!(CONTENDED, "backend" => backend).increment(u64::from(contended));
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, attempts, contended);
}

/// One `try_acquire` / `acquire` call ended: `Ok(true)` granted, `Ok(false)` held elsewhere.
#[inline(always)]
pub(crate) fn acquired(
    backend: &'static str,
    result: &Result<bool, &crate::error::Error>,
    started: tokio::time::Instant,
) {
    #[cfg(feature = "metrics")]
    {
        let outcome = match result {
            Ok(true) => "acquired",
            Ok(false) => "contended",
            Err(e) if e.kind() == ErrorKind::Timeout => {
                metrics::counter!(ACQUIRE_TIMEOUTS, "backend" => backend).increment(1);
                "timeout"
            }
            Err(_) => "error",
        };
        metrics::histogram!(ACQUIRE_SECONDS, "backend" => backend, "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, result, started);
}

/// A lease was granted (`+1`) or released / dropped (`-1`).
#[inline(always)]
pub(crate) fn held(backend: &'static str, delta: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(LEASES_HELD, "backend" => backend).increment(delta);
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, delta);
}

/// A lease was lost (counted once per lease, at the first sign of the loss).
#[cfg(feature = "metrics")]
pub(crate) fn lost(backend: &'static str, reason: &LossReason) {
    let reason = match reason {
        LossReason::Expired => "expired",
        LossReason::NotHeld => "not_held",
        LossReason::RenewalFailed(_) => "renewal_failed",
        LossReason::Backend(_) => "backend",
        LossReason::Released => return,
    };
    metrics::counter!(LEASES_LOST, "backend" => backend, "reason" => reason).increment(1);
}

/// A renewal failed with a fault.
#[inline(always)]
pub(crate) fn renewal_failed(backend: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(RENEWAL_FAILURES, "backend" => backend).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = backend;
}

/// A release is sent again after a transient fault.
#[inline(always)]
pub(crate) fn release_retried(backend: &'static str) {
    increment(RELEASE_RETRIES, backend);
}

/// A release is left to the background retrier.
#[inline(always)]
pub(crate) fn release_backgrounded(backend: &'static str) {
    increment(RELEASES_BACKGROUNDED, backend);
}

/// A release found the backend's release gate full and waits its turn.
#[inline(always)]
pub(crate) fn release_waited(backend: &'static str) {
    increment(RELEASE_WAITS, backend);
}

/// Adds one to counter `name` of `backend`.
#[inline(always)]
fn increment(name: &'static str, backend: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(name, "backend" => backend).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (name, backend);
}

/// A background release stopped without an answer (`reason`: `expired` or `error`).
#[inline(always)]
pub(crate) fn release_given_up(backend: &'static str, reason: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(RELEASES_GIVEN_UP, "backend" => backend, "reason" => reason).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, reason);
}

/// A renewal batch of `size` leases ended, `failed` of them with a fault.
#[inline(always)]
pub(crate) fn renewal_batch(
    backend: &'static str,
    size: usize,
    failed: usize,
    started: tokio::time::Instant,
) {
    #[cfg(feature = "metrics")]
    {
        #[allow(clippy::cast_precision_loss)] // batch sizes are far below 2^52
        metrics::histogram!(RENEWAL_BATCH_SIZE, "backend" => backend).record(size as f64);
        metrics::histogram!(RENEWAL_BATCH_SECONDS, "backend" => backend)
            .record(started.elapsed().as_secs_f64());
        if failed > 0 {
            metrics::counter!(RENEWAL_BATCH_FAILURES, "backend" => backend).increment(1);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, size, failed, started);
}

/// A backend's session pool (a driver's, e.g. PostgreSQL's bounded pool) opened (`+n`) or
/// closed (`-n`) sessions; [`POOL_SESSIONS`] sums every pool of the backend's name. For
/// drivers; does nothing without the `metrics` feature.
#[inline(always)]
pub fn pool_sessions(backend: &'static str, delta: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!(POOL_SESSIONS, "backend" => backend).increment(delta);
    #[cfg(not(feature = "metrics"))]
    let _ = (backend, delta);
}

/// A request starts waiting for a session of a full pool; the returned guard counts it in
/// [`POOL_WAITERS`] until dropped, and then records the wait in [`POOL_WAIT_SECONDS`]. For
/// drivers; records nothing without the `metrics` feature.
pub fn pool_wait(backend: &'static str) -> PoolWait {
    #[cfg(feature = "metrics")]
    metrics::gauge!(POOL_WAITERS, "backend" => backend).increment(1.0);
    PoolWait {
        backend,
        started: tokio::time::Instant::now(),
    }
}

/// A wait for a pool's session, counted until dropped (see [`pool_wait`]).
#[derive(Debug)]
pub struct PoolWait {
    backend: &'static str,
    started: tokio::time::Instant,
}

impl Drop for PoolWait {
    fn drop(&mut self) {
        #[cfg(feature = "metrics")]
        {
            metrics::gauge!(POOL_WAITERS, "backend" => self.backend).decrement(1.0);
            metrics::histogram!(POOL_WAIT_SECONDS, "backend" => self.backend)
                .record(self.started.elapsed().as_secs_f64());
        }
        #[cfg(not(feature = "metrics"))]
        let _ = (self.backend, self.started);
    }
}
