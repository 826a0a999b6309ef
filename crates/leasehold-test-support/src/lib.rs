//! Dev-only test support for leasehold: where the real services are ([`services`]), a
//! fault-injecting TCP proxy ([`proxy`]), a fenced resource ([`fence`]) and the
//! [`conformance`] suite that every backend's tests run.
//!
//! Not published; every crate of the workspace uses it as a dev-dependency, so no test helper is
//! written twice.

pub mod conformance;
pub mod fence;
pub mod proxy;
pub mod services;
