//! The file backend's permit view passes the semaphore checks: two backends on one folder
//! stand for two processes; the loss of a permit is its slot file deleted by hand.

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{LockBackend, PermitLimit};
use leasehold_file::{FileBackend, FileConfig};
use leasehold_test_support::conformance::Target;
use leasehold_test_support::services::TempFolder;

async fn target() -> Option<Target> {
    let dir = TempFolder::new("file-semaphore");
    let config = FileConfig::new(dir.path()).with_check_interval(Duration::from_millis(50));
    let (primary, other) = match (FileBackend::new(config.clone()), FileBackend::new(config)) {
        (Ok(p), Ok(o)) => (p, o),
        (Err(e), _) | (_, Err(e)) => panic!("file backend: {e}"),
    };
    let limit = PermitLimit::new(2).unwrap_or_else(|e| panic!("{e}"));
    let view = Arc::new(primary.clone())
        .semaphore(limit)
        .unwrap_or_else(|e| panic!("no permit view: {e}"));
    Some(
        Target::new(
            Arc::new(primary),
            Arc::new(other),
            Duration::from_millis(300),
        )
        .with_expire(Arc::new(move |lease| {
            let view = Arc::clone(&view);
            Box::pin(async move {
                // Someone deletes the slot file of this permit: its holder is told.
                let holders = view.holders(lease.key()).await.unwrap_or_default();
                let ours = holders
                    .iter()
                    .find(|h| h.owner.as_ref() == Some(lease.owner()))
                    .and_then(|h| h.detail.as_deref()?.strip_prefix("slot file "))
                    .unwrap_or_else(|| panic!("no slot file holds {:?}", lease.owner()));
                std::fs::remove_file(ours).unwrap_or_else(|e| panic!("{ours}: {e}"));
            })
        }))
        .keeping(dir),
    )
}

leasehold_test_support::semaphore_tests!(target);
