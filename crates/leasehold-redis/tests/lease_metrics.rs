//! leasehold-core's lease metrics on real Redis, Redlock and a Redis Cluster: acquisitions,
//! leases held, renewal batches (size, latency, no failure), through the check every real
//! backend runs. (Failed batches and release retries: `renewal_metrics.rs`,
//! `release_faults.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use leasehold_core::{LockBackend, ReleaseGate};
use leasehold_test_support::metrics::check_lease_metrics;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;

const TTL: Duration = Duration::from_secs(3);

#[tokio::test]
async fn leases_are_counted_on_redis() {
    let ep = require_service!(Service::Redis);
    // A release gate of another size than the default, from the URL: the burst waits at it.
    let sep = if ep.url().contains('?') { '&' } else { '?' };
    let url = format!("{}{sep}releases_in_flight=16", ep.url());
    let backend = common::redis(&url, &common::prefix("lease-metrics")).await;
    assert_eq!(backend.release_gate().map(ReleaseGate::size), Some(16));
    check_lease_metrics(backend, TTL).await;
}

#[tokio::test]
async fn leases_are_counted_on_redlock() {
    let ep = require_service!(Service::Redlock);
    let backend = common::redlock(ep.urls(), &common::prefix("lease-metrics"));
    check_lease_metrics(backend, TTL).await;
}

#[tokio::test]
async fn leases_are_counted_on_a_redis_cluster() {
    let ep = require_service!(Service::RedisCluster);
    let backend = common::redis_cluster(ep.urls(), &common::prefix("lease-metrics")).await;
    check_lease_metrics(backend, TTL).await;
}
