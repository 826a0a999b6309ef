//! Every held lock and permit keeps its lock file open: at the process's open-file limit an
//! acquisition fails `Unavailable` with a message naming that limit, the leases already held
//! stay held, and one released makes room for the next. (A test binary of its own: it lowers
//! the whole process's limit.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use leasehold_core::{ErrorKind, Locker, Semaphore};
use leasehold_file::{FileBackend, FileConfig};
use nix::sys::resource::{Resource, getrlimit, setrlimit};

use common::fresh;

/// How many descriptors this process has open.
fn open_now() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_open_file_limit_acquisitions_fail_clearly_and_held_leases_stay() {
    let dir = fresh("open-files");
    let backend = FileBackend::new(FileConfig::new(&dir)).unwrap();
    let locker = Locker::new(backend.clone());
    let sem = Semaphore::new(backend.clone(), 4).unwrap();
    // A few leases first, so that the runtime's blocking threads exist before the limit.
    let mut held = Vec::new();
    for i in 0..4 {
        held.push(locker.try_acquire(format!("k{i}")).await.unwrap().unwrap());
    }
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let room = 60;
    setrlimit(Resource::RLIMIT_NOFILE, open_now() + room, hard).unwrap();

    let refused = loop {
        let i = held.len();
        assert!(i < 1_000, "no limit hit after {i} leases");
        match locker.try_acquire(format!("k{i}")).await {
            Ok(Some(lease)) => held.push(lease),
            Ok(None) => panic!("k{i} is free"),
            Err(e) => break e,
        }
    };
    let taken = held.len();
    assert!(
        taken >= 4 + room as usize / 2,
        "only {taken} leases before the limit"
    );
    assert_eq!(refused.kind(), ErrorKind::Unavailable, "{refused}");
    assert!(refused.to_string().contains("open-file limit"), "{refused}");
    // A permit needs a descriptor too, and says the same.
    let permit = sem.try_acquire("slots").await.unwrap_err();
    assert_eq!(permit.kind(), ErrorKind::Unavailable, "{permit}");
    assert!(permit.to_string().contains("open-file limit"), "{permit}");

    // Nothing held was touched: every lease is still held and counted.
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    assert!(held.iter().all(|l| !l.is_lost()));
    assert_eq!(backend.held_count(), taken);
    // One released frees the descriptor the next acquisition needs.
    assert!(held.pop().unwrap().release().await.unwrap());
    held.push(
        locker
            .try_acquire(format!("k{taken}"))
            .await
            .unwrap()
            .expect("free"),
    );

    for lease in held {
        assert!(lease.release().await.unwrap());
    }
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    assert_eq!(backend.held_count(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
