//! The file backend, imported in this one place: the perf groups and the safety table both
//! take it from here.

pub(crate) use leasehold_file::{FileBackend, FileConfig};
