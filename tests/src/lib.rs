//! End-to-end tests of leasehold live in `tests/`.
