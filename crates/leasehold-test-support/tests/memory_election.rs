//! The in-memory backend passes the election checks.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{LockBackend, MemoryBackend};
use leasehold_test_support::conformance::election::ElectionTarget;

async fn target() -> Option<Target> {
    let shared: Arc<dyn LockBackend> = Arc::new(MemoryBackend::new());
    // A native wait: the hand-over is a wake-up. 300 ms leaves room for a stall of the loaded
    // machine; a candidate polling with the default backoff (up to 500 ms) would often, not
    // always, take longer.
    Some(ElectionTarget::new(
        Arc::clone(&shared),
        shared,
        Duration::from_secs(2),
        Duration::from_millis(300),
    ))
}

type Target = ElectionTarget;

leasehold_test_support::election_tests!(target);
