//! The in-memory backend passes the whole conformance suite.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{LockBackend, MemoryBackend};
use leasehold_test_support::conformance::Target;

async fn target() -> Option<Target> {
    let backend = MemoryBackend::new();
    let counter = backend.clone();
    let shared: Arc<dyn LockBackend> = Arc::new(backend);
    Some(
        Target::new(Arc::clone(&shared), shared, Duration::from_millis(300)).with_held(Arc::new(
            move || {
                let n = counter.held_count();
                Box::pin(async move { Ok(n) })
            },
        )),
    )
}

leasehold_test_support::conformance_tests!(target);
