//! Runnable examples of leasehold; see the `[[example]]` targets. The library holds what the
//! examples and their tests share: the axum service of `examples/axum_service.rs`.

pub mod counters;
