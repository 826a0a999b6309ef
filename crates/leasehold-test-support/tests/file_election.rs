//! The file backend passes the election checks: two backends on one folder stand for two
//! processes; the lapse is the leader file deleted by hand.

use std::sync::Arc;
use std::time::Duration;

use leasehold_file::{FileBackend, FileConfig};
use leasehold_test_support::conformance::election::ElectionTarget;
use leasehold_test_support::services::TempFolder;

async fn target() -> Option<ElectionTarget> {
    let dir = TempFolder::new("file-election");
    let config = FileConfig::new(dir.path()).with_check_interval(Duration::from_millis(50));
    let (primary, other) = match (FileBackend::new(config.clone()), FileBackend::new(config)) {
        (Ok(p), Ok(o)) => (p, o),
        (Err(e), _) | (_, Err(e)) => panic!("file backend: {e}"),
    };
    let elections = dir.join("elections");
    // Waiting polls (backoff up to 500 ms): a hand-over takes at most one poll, plus slack.
    // A 1 s TTL: a renewed leadership survives a stall of the loaded machine of ~600 ms.
    Some(
        ElectionTarget::new(
            Arc::new(primary),
            Arc::new(other),
            Duration::from_secs(1),
            Duration::from_millis(1500),
        )
        .with_expire(Arc::new(move |lease| {
            let paths = FileBackend::new(FileConfig::new(&elections));
            let path = paths.map(|p| p.lock_path(lease.key()));
            Box::pin(async move {
                // Someone deletes the leader file: the leader is told, others may lead anew.
                if let Ok(path) = path {
                    let _ = std::fs::remove_file(&path);
                }
            })
        }))
        .keeping(dir),
    )
}

leasehold_test_support::election_tests!(target);
