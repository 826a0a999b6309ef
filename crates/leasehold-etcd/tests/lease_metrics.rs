//! leasehold-core's lease metrics on real etcd (session lease and a lease per lock), through
//! the check every real backend runs. (Release retries under a burst: `release_burst.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use leasehold_core::{LockBackend, RELEASES_IN_FLIGHT, ReleaseGate};
use leasehold_etcd::LeaseMode;
use leasehold_test_support::metrics::check_lease_metrics;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;

#[tokio::test]
async fn leases_are_counted_on_etcd() {
    let ep = require_service!(Service::Etcd);
    // The per-lock mode with a release gate of its own size: the burst must wait at that one.
    for (mode, gate) in [(LeaseMode::Session, None), (LeaseMode::PerLock, Some(16))] {
        let mut cfg = common::config(&ep, &common::prefix("lease-metrics"), mode);
        if let Some(n) = gate {
            cfg = cfg.with_releases_in_flight(n).unwrap();
        }
        let backend = common::connect(&ep, cfg).await;
        let size = backend.release_gate().map(ReleaseGate::size);
        assert_eq!(size, Some(gate.unwrap_or(RELEASES_IN_FLIGHT)));
        check_lease_metrics(backend, Duration::from_secs(3)).await;
    }
}
