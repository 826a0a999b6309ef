//! The conformance suite on one real Redis server.

mod common;

use leasehold_test_support::conformance::Target;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;

async fn target() -> Option<Target> {
    let ep = require_service!(Service::Redis, None);
    Some(common::single_target(&ep).await)
}

leasehold_test_support::conformance_tests!(target);
