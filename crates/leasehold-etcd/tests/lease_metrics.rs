//! leasehold-core's lease metrics on real etcd (session lease and a lease per lock), through
//! the check every real backend runs. (Release retries under a burst: `release_burst.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use leasehold_etcd::LeaseMode;
use leasehold_test_support::metrics::check_lease_metrics;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;

#[tokio::test]
async fn leases_are_counted_on_etcd() {
    let ep = require_service!(Service::Etcd);
    for mode in [LeaseMode::Session, LeaseMode::PerLock] {
        let backend = common::backend(&ep, &common::prefix("lease-metrics"), mode).await;
        check_lease_metrics(backend, Duration::from_secs(3)).await;
    }
}
