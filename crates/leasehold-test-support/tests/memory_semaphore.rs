//! The in-memory backend's permit view passes the semaphore checks.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{LockBackend, MemoryBackend};
use leasehold_test_support::conformance::Target;

async fn target() -> Option<Target> {
    let shared: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    Some(Target::new(
        Arc::clone(&shared),
        shared,
        Duration::from_millis(300),
    ))
}

leasehold_test_support::semaphore_tests!(target);
