//! Dev-only test support for leasehold.

pub mod proxy;
pub mod services;
