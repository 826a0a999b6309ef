//! The conformance suite on the 3-member etcd cluster (session leases).

mod common;

use leasehold_etcd::LeaseMode;
use leasehold_test_support::conformance::Target;
use leasehold_test_support::services::Service;

async fn target() -> Option<Target> {
    common::target(Service::EtcdCluster, LeaseMode::Session, "etcd-cluster").await
}

leasehold_test_support::conformance_tests!(target);
