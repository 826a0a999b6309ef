//! The renewal engine's batch metrics, read back on real Redis through a debugging recorder.
//! (A test binary of its own: the recorder is global to the process.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use futures_util::future::join_all;
use leasehold_core::metrics::{RENEWAL_BATCH_FAILURES, RENEWAL_BATCH_SECONDS, RENEWAL_BATCH_SIZE};
use leasehold_core::{Lease, Renewal};
use leasehold_test_support::harness;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

const REDIS: (&str, &str) = ("backend", "redis");

/// What was recorded with the `backend=redis` label since the last snapshot (taking a
/// snapshot resets every value): per name, the histogram values and the counter total.
struct Recorded(Vec<(String, Vec<f64>, u64)>);

impl Recorded {
    fn take(s: &Snapshotter) -> Self {
        let mut out = Vec::new();
        for (ck, _, _, v) in s.snapshot().into_vec() {
            let key = ck.key();
            let ours = key
                .labels()
                .any(|l| l.key() == REDIS.0 && l.value() == REDIS.1);
            if !ours {
                continue;
            }
            let (values, count) = match v {
                DebugValue::Histogram(h) => (h.iter().map(|x| x.into_inner()).collect(), 0),
                DebugValue::Counter(n) => (Vec::new(), n),
                DebugValue::Gauge(_) => continue,
            };
            out.push((key.name().to_owned(), values, count));
        }
        Self(out)
    }

    fn values(&self, name: &str) -> Vec<f64> {
        let found = self.0.iter().filter(|(n, _, _)| n == name);
        found.flat_map(|(_, v, _)| v.iter().copied()).collect()
    }

    fn count(&self, name: &str) -> u64 {
        let found = self.0.iter().filter(|(n, _, _)| n == name);
        found.map(|(_, _, c)| c).sum()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_batches_are_measured_by_size_latency_and_failures() {
    let ep = require_service!(Service::Redis);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::set_global_recorder(recorder).expect("the only recorder of this binary");

    let prefix = common::prefix("renew-metrics");
    let (backend, proxy) = common::redis_behind_proxy(&ep, &prefix, Duration::from_secs(1)).await;
    let ttl = Duration::from_millis(1_500);
    let l = harness::locker(backend, ttl, Renewal::Auto);
    let leases: Vec<Lease> = join_all((0..300).map(|i| l.try_acquire(format!("m{i}"))))
        .await
        .into_iter()
        .map(|r| r.unwrap().expect("free"))
        .collect();

    // Two renewal periods (ttl / 3 each) and a little more.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let sizes = Recorded::take(&snapshotter).values(RENEWAL_BATCH_SIZE);
    let total: f64 = sizes.iter().sum();
    assert!(
        total >= 300.0,
        "every lease renewed at least once: {sizes:?}"
    );
    let biggest = sizes.iter().copied().fold(0.0, f64::max);
    assert!(
        biggest >= 50.0,
        "leases taken together renew together, yet the biggest batch held {biggest}"
    );
    assert!(
        sizes.len() * 10 <= 300 * 2,
        "{} batches for 300 leases over ~2 periods: not batched",
        sizes.len()
    );
    // The snapshot above reset the histograms: batches since then.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let recorded = Recorded::take(&snapshotter);
    let sizes = recorded.values(RENEWAL_BATCH_SIZE);
    let latencies = recorded.values(RENEWAL_BATCH_SECONDS);
    assert!(!sizes.is_empty(), "renewals went on");
    assert_eq!(latencies.len(), sizes.len(), "one latency per batch");
    assert!(
        latencies.iter().all(|&s| s > 0.0 && s < 1.0),
        "{latencies:?}"
    );
    assert_eq!(recorded.count(RENEWAL_BATCH_FAILURES), 0, "no failure yet");

    // Unanswered batches count as failures (each is bounded by the renewal period).
    proxy.blackhole();
    let (mut failed, until) = (0, tokio::time::Instant::now() + Duration::from_secs(5));
    while failed == 0 && tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(100)).await;
        failed += Recorded::take(&snapshotter).count(RENEWAL_BATCH_FAILURES);
    }
    assert!(
        failed >= 1,
        "a timed-out batch was not counted as a failure"
    );
    proxy.pass();
    drop(leases);
}
