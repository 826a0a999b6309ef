//! leasehold facade
