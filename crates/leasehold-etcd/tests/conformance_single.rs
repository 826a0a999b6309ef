//! The conformance suite on the single etcd member, in both lease modes.

mod common;

mod session {
    use leasehold_etcd::LeaseMode;
    use leasehold_test_support::conformance::Target;
    use leasehold_test_support::services::Service;

    async fn target() -> Option<Target> {
        super::common::target(Service::Etcd, LeaseMode::Session, "etcd-session").await
    }

    leasehold_test_support::conformance_tests!(target);
}

mod per_lock {
    use leasehold_etcd::LeaseMode;
    use leasehold_test_support::conformance::Target;
    use leasehold_test_support::services::Service;

    async fn target() -> Option<Target> {
        super::common::target(Service::Etcd, LeaseMode::PerLock, "etcd-per-lock").await
    }

    leasehold_test_support::conformance_tests!(target);
}
