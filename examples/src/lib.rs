//! Runnable examples of leasehold; see the `[[example]]` targets.
