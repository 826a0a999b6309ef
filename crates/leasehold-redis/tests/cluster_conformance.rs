//! The conformance suite on a real 3-master Redis Cluster.

mod common;

use leasehold_test_support::conformance::Target;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;

async fn target() -> Option<Target> {
    let ep = require_service!(Service::RedisCluster, None);
    Some(common::cluster_target(ep.urls()).await)
}

leasehold_test_support::conformance_tests!(target);
