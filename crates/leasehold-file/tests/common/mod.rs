//! Shared by the test binaries of this crate (each includes it with `mod common;`).

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use leasehold_core::LockKey;

/// A fresh path under the temporary folder (not created), unique to this process and call.
pub(crate) fn fresh(name: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    std::env::temp_dir().join(format!(
        "leasehold-file-{name}-{}-{nanos}",
        std::process::id()
    ))
}

pub(crate) fn key(k: &str) -> LockKey {
    LockKey::new(k).unwrap_or_else(|e| panic!("{e}"))
}
