//! The in-memory backend passes the election checks.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{LockBackend, MemoryBackend};
use leasehold_test_support::conformance::election::ElectionTarget;

async fn target() -> Option<Target> {
    let shared: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    // A native wait: the hand-over is a wake-up, far under the TTL.
    Some(ElectionTarget::new(
        Arc::clone(&shared),
        shared,
        Duration::from_millis(500),
        Duration::from_millis(100),
    ))
}

type Target = ElectionTarget;

leasehold_test_support::election_tests!(target);
