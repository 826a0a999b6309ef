//! The file backend passes the conformance suite: two backends on one folder stand for two
//! processes; the expiry fault is the lock file deleted by hand.

use std::sync::Arc;
use std::time::Duration;

use leasehold_file::{FileBackend, FileConfig};
use leasehold_test_support::conformance::Target;
use leasehold_test_support::services::TempFolder;

async fn target() -> Option<Target> {
    let dir = TempFolder::new("file-conformance");
    let config = FileConfig::new(dir.path()).with_check_interval(Duration::from_millis(50));
    let (primary, other) = match (FileBackend::new(config.clone()), FileBackend::new(config)) {
        (Ok(p), Ok(o)) => (p, o),
        (Err(e), _) | (_, Err(e)) => panic!("file backend: {e}"),
    };
    let (count_a, count_b, paths) = (primary.clone(), other.clone(), primary.clone());
    Some(
        Target::new(
            Arc::new(primary),
            Arc::new(other),
            Duration::from_millis(300),
        )
        .with_held(Arc::new(move || {
            let n = count_a.held_count() + count_b.held_count();
            Box::pin(async move { Ok(n) })
        }))
        .with_expire(Arc::new(move |lease| {
            let path = paths.lock_path(lease.key());
            Box::pin(async move {
                // Someone deletes the lock file: the holder is told, others may lock anew.
                let _ = std::fs::remove_file(&path);
            })
        }))
        .keeping(dir),
    )
}

leasehold_test_support::conformance_tests!(target);
