//! The conformance suite on one real Redis server in fair mode (server-side queue of waiters).

mod common;

use std::time::Duration;

use leasehold_test_support::conformance::Target;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;

async fn target() -> Option<Target> {
    let ep = require_service!(Service::Redis, None);
    let prefix = common::prefix("fair_conformance");
    let primary = common::redis_fair(ep.url(), &prefix, Duration::from_secs(1)).await;
    let other = common::redis_fair(ep.url(), &prefix, Duration::from_secs(1)).await;
    Some(common::single_node_target(primary, other))
}

leasehold_test_support::conformance_tests!(target);
