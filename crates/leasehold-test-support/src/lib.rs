//! Dev-only test support for leasehold: where the real services are ([`services`]), a
//! fault-injecting TCP proxy ([`proxy`]), PostgreSQL administration ([`postgres`]: inspect and
//! end the sessions holding a lock), etcd's leader ([`etcd`]), a fenced resource ([`fence`]), the set-up driver tests
//! share ([`harness`]), captured log lines ([`logs`]), real network partitions in Linux network
//! namespaces ([`netns`]) and the [`conformance`] suite that every backend's tests run.
//!
//! Not published; every crate of the workspace uses it as a dev-dependency, so no test helper is
//! written twice.

pub mod conformance;
pub mod etcd;
pub mod fence;
pub mod harness;
pub mod logs;
pub mod metrics;
pub mod netns;
pub mod postgres;
pub mod proxy;
pub mod services;

/// The error of test helpers that can fail in several ways.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
