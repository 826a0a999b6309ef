//! Every held lock and permit keeps its lock file open: at the process's open-file limit an
//! acquisition fails `Unavailable` with a message naming that limit, the leases already held
//! stay held, and one released makes room for the next. (A test binary of its own: it lowers
//! the whole process's limit.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use leasehold_core::{Candidate, Elector, ErrorKind, LockOptions, Locker, Semaphore};
use leasehold_file::{FileBackend, FileConfig};
use nix::sys::resource::{Resource, getrlimit, setrlimit};

use common::fresh;

/// How many descriptors this process has open.
fn open_now() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

/// The open-file limit at which exactly `spare` more descriptors can be opened. The limit
/// bounds descriptor numbers, not their count, so the free numbers below it are what count.
fn limit_leaving(spare: usize) -> u64 {
    let listing = std::fs::read_dir("/proc/self/fd").unwrap();
    let open: std::collections::BTreeSet<u64> = listing
        .filter_map(|e| {
            let e = e.unwrap();
            // Not the listing's own descriptor (it points at the folder being listed).
            let target = std::fs::read_link(e.path()).ok()?;
            (!target.ends_with("fd")).then(|| e.file_name().to_str()?.parse().ok())?
        })
        .collect();
    (0..).filter(|n| !open.contains(n)).nth(spare).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_open_file_limit_acquisitions_fail_clearly_and_held_leases_stay() {
    let dir = fresh("open-files");
    let backend = FileBackend::new(FileConfig::new(&dir)).unwrap();
    let locker = Locker::new(backend.clone());
    let sem = Semaphore::new(backend.clone(), 4).unwrap();
    // A leader elected before the limit: reading its side file needs a descriptor.
    let elector = Elector::new(
        Arc::new(backend.clone()),
        "leader",
        Candidate::new("node-a").unwrap(),
        LockOptions::default(),
    )
    .unwrap();
    let leadership = elector.campaign().await.unwrap();
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
    // So does reading an election's leader, whether no descriptor is left (the lock file
    // cannot be opened) or one is (its fence counter cannot): reading the leader holds both
    // open at once. With two it reads the leader. The leadership itself stays throughout.
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    let limits: Vec<u64> = (0..3).map(limit_leaving).collect();
    for (spare, &limit) in limits[..2].iter().enumerate() {
        setrlimit(Resource::RLIMIT_NOFILE, limit, hard).unwrap();
        let leader = elector.leader().await.unwrap_err();
        assert_eq!(leader.kind(), ErrorKind::Unavailable, "{spare}: {leader}");
        assert!(
            leader.to_string().contains("open-file limit"),
            "{spare}: {leader}"
        );
    }
    setrlimit(Resource::RLIMIT_NOFILE, limits[2], hard).unwrap();
    let seen = elector.leader().await.unwrap().expect("a leader");
    assert_eq!(seen.value.as_str(), "node-a");
    // Back to where the refused acquisition left us: one descriptor spare, one short of the
    // lock file and fence counter an acquisition holds open at once.
    setrlimit(Resource::RLIMIT_NOFILE, limits[1], hard).unwrap();

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
    assert!(!leadership.is_lost());
    leadership.resign().await.unwrap();
    assert_eq!(backend.held_count(), 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
