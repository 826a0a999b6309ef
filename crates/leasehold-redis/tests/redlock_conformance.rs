//! The conformance suite on Redlock over five real Redis servers.

mod common;

use leasehold_test_support::conformance::Target;
use leasehold_test_support::require_service;
use leasehold_test_support::services::Service;

async fn target() -> Option<Target> {
    let ep = require_service!(Service::Redlock, None);
    Some(common::redlock_target(ep.urls()))
}

leasehold_test_support::conformance_tests!(target);
