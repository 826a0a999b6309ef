//! Reading metrics back in tests, from metrics-util's debugging recorder, and the check of the
//! lease metrics every real backend's tests run ([`check_lease_metrics`]).
//!
//! [`record_here`] installs a recorder for the test's thread: run the test on a current-thread
//! runtime, so that tasks leasehold spawns (background releases, the renewal engine) record
//! into it too, and read the totals once, at the end (a snapshot resets them).

use std::collections::BTreeMap;
use std::time::Duration;

use leasehold_core::metrics::{
    ACQUIRE_ATTEMPTS, ACQUIRE_SECONDS, LEASES_HELD, LEASES_LOST, RELEASE_WAITS,
    RENEWAL_BATCH_FAILURES, RENEWAL_BATCH_SECONDS, RENEWAL_BATCH_SIZE,
};
use leasehold_core::{LockBackend, Locker, ReleaseGate, Renewal, RenewalKind, settle};
use metrics::LocalRecorderGuard;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Records the metrics of this thread into a debugging recorder until the guard is dropped;
/// read them with [`counters`] or [`recorded`]. The recorder is leaked (one per test).
pub fn record_here() -> (Snapshotter, LocalRecorderGuard<'static>) {
    let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
    (
        recorder.snapshotter(),
        metrics::set_default_local_recorder(recorder),
    )
}

/// Every counter recorded so far, summed over its labels, by name (resets the recorder).
pub fn counters(snapshotter: &Snapshotter) -> Counters {
    Counters(recorded(snapshotter).counters)
}

/// Counter totals by name, as [`counters`] read them.
#[derive(Debug, Clone, Default)]
pub struct Counters(BTreeMap<String, u64>);

impl Counters {
    /// The total of counter `name` (0 if it was never recorded).
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }
}

/// Everything recorded so far, by name, summed over labels (gauges, counters) or pooled
/// (histogram samples); read by [`recorded`].
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    counters: BTreeMap<String, u64>,
    gauges: BTreeMap<String, f64>,
    samples: BTreeMap<String, Vec<f64>>,
}

impl Recorded {
    /// The total of counter `name` (0 if never recorded).
    pub fn counter(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// Gauge `name` summed over its labels (`None` if never recorded).
    pub fn gauge(&self, name: &str) -> Option<f64> {
        self.gauges.get(name).copied()
    }

    /// Every sample of histogram `name` (empty if never recorded).
    pub fn samples(&self, name: &str) -> &[f64] {
        self.samples.get(name).map_or(&[], Vec::as_slice)
    }
}

/// Every metric recorded since the last snapshot (taking one resets what it read: add
/// gauges read in several snapshots).
pub fn recorded(snapshotter: &Snapshotter) -> Recorded {
    let mut r = Recorded::default();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = key.key().name().to_owned();
        match value {
            DebugValue::Counter(n) => *r.counters.entry(name).or_insert(0) += n,
            DebugValue::Gauge(g) => *r.gauges.entry(name).or_insert(0.0) += g.into_inner(),
            DebugValue::Histogram(v) => r
                .samples
                .entry(name)
                .or_default()
                .extend(v.into_iter().map(|x| x.into_inner())),
        }
    }
    r
}

/// Leases [`check_lease_metrics`] takes.
pub const LEASES: usize = 40;

/// Takes [`LEASES`] leases from `backend` (TTL `ttl`, renewed every `ttl / 6`), holds them
/// for a TTL, extends one, releases all but one and drops that one, then settles, under a
/// recorder installed here; checks what every backend must record and returns it all for
/// the caller's own checks: one acquisition each (`leasehold_acquire_seconds`,
/// `leasehold_acquire_attempts_total`), none lost, `leasehold_leases_held` back to 0, a burst of
/// releases larger than the backend's release gate that waits at it
/// (`leasehold_release_waits_total`), and on a
/// backend that renews by extending, renewal batches that carried several leases each, every
/// lease renewed, each batch timed, none failed. Call it on a current-thread runtime.
pub async fn check_lease_metrics(backend: impl LockBackend, ttl: Duration) -> Recorded {
    let (snapshotter, _local) = record_here();
    let caps = backend.capabilities();
    let gate = backend
        .release_gate()
        .map(ReleaseGate::size)
        .unwrap_or_else(|| panic!("a real backend keeps a release gate"));
    let locker = crate::harness::locker(backend, ttl, Renewal::Every(ttl / 6));
    let tag = crate::services::unique_prefix("metrics");
    let mut leases = Vec::with_capacity(LEASES);
    for i in 0..LEASES {
        let taken = locker.try_acquire(format!("{tag}-{i}")).await;
        let taken = taken.unwrap_or_else(|e| panic!("acquire: {e}"));
        leases.push(taken.unwrap_or_else(|| panic!("a fresh key is held elsewhere")));
    }
    tokio::time::sleep(ttl).await;
    leases[0]
        .extend(ttl)
        .await
        .unwrap_or_else(|e| panic!("extend: {e}"));
    let dropped = leases.pop();
    for l in &leases {
        assert!(l.release().await.unwrap_or_else(|e| panic!("release: {e}")));
    }
    drop(dropped);
    assert!(settle(Duration::from_secs(10)).await, "background releases");
    let burst = release_burst(&locker, &tag, gate).await;
    let r = recorded(&snapshotter);
    let n = (LEASES + burst) as u64;
    assert_eq!(
        r.samples(ACQUIRE_SECONDS).len(),
        LEASES + burst,
        "one per acquisition"
    );
    assert!(
        r.counter(RELEASE_WAITS) >= (burst - gate) as u64,
        "a burst larger than the release gate ({gate} places) waits at the gate: {} waits for \
         {burst} releases",
        r.counter(RELEASE_WAITS)
    );
    assert!(r.counter(ACQUIRE_ATTEMPTS) >= n);
    assert_eq!(r.counter(LEASES_LOST), 0, "no lease was lost");
    assert_eq!(r.gauge(LEASES_HELD), Some(0.0), "every lease let go");
    if caps.renewal == RenewalKind::Extend {
        let sizes = r.samples(RENEWAL_BATCH_SIZE);
        assert!(!sizes.is_empty(), "renewal batches were recorded");
        let renewed: f64 = sizes.iter().sum();
        assert!(
            renewed >= LEASES as f64,
            "every lease renewed at least once: {sizes:?}"
        );
        assert!(
            sizes.iter().any(|&s| s > 1.0),
            "leases taken together renew together: {sizes:?}"
        );
        let times = r.samples(RENEWAL_BATCH_SECONDS);
        assert_eq!(times.len(), sizes.len(), "every batch timed");
        assert!(times.iter().all(|&t| t > 0.0 && t < ttl.as_secs_f64()));
        assert_eq!(r.counter(RENEWAL_BATCH_FAILURES), 0, "no batch failed");
    } else {
        assert!(
            r.samples(RENEWAL_BATCH_SIZE).is_empty(),
            "no renewal engine"
        );
    }
    r
}

/// Takes more leases than the backend's release gate has places (`gate`), releases them all at
/// once and checks that every release lands; returns how many it took. On a current-thread
/// runtime every release task takes its first step before any answer is read, so all but the
/// gate's places wait their turn (and count in `leasehold_release_waits_total`).
async fn release_burst(locker: &Locker, tag: &str, gate: usize) -> usize {
    let burst = gate + 64;
    let mut leases = Vec::with_capacity(burst);
    for i in 0..burst {
        let taken = locker.try_acquire(format!("{tag}-burst-{i}")).await;
        let taken = taken.unwrap_or_else(|e| panic!("acquire: {e}"));
        leases.push(taken.unwrap_or_else(|| panic!("a fresh key is held elsewhere")));
    }
    // Spawned together, after every acquisition: none runs before the test task yields.
    let mut tasks = tokio::task::JoinSet::new();
    for lease in leases {
        tasks.spawn(async move { lease.release().await });
    }
    let released = tasks.join_all().await;
    let landed = released.iter().filter(|r| matches!(r, Ok(true))).count();
    assert_eq!(
        landed, burst,
        "every release of the burst lands: {released:?}"
    );
    burst
}
