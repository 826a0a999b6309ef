//! Cross-crate end-to-end tests of leasehold, in `tests/tests/`: one service built from a
//! `LockConfig`, with `LockLayer` in front and `FenceLayer` at its store, switched across every
//! backend and run under a real fault against the servers of `scripts/services up`.
//!
//! The library itself is empty; run the tests with `cargo test -p leasehold-e2e`.
