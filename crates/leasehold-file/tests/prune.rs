//! `FileBackend::prune`: deletes lock files nobody holds, keeps fence files and held locks, and
//! never lets two holders in, even when it races acquirers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_core::{LockOptions, Locker, Renewal, Semaphore};
use leasehold_file::{FileBackend, FileConfig};

use common::{fresh, key};

fn names(dir: &PathBuf) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

fn locker(backend: FileBackend) -> Locker {
    Locker::new(backend)
        .with_options(LockOptions::default().with_renewal(Renewal::Off))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_deletes_free_lock_files_and_keeps_fences_and_held_locks() {
    let dir = fresh("basic");
    let backend = FileBackend::new(FileConfig::new(&dir)).unwrap();
    let l = locker(backend.clone());
    let a = l.try_acquire("a").await.unwrap().expect("free");
    let first = a.fencing_token();
    assert!(a.release().await.unwrap());
    let b = l.try_acquire("b").await.unwrap().expect("free");
    assert!(b.release().await.unwrap());
    let held = l.try_acquire("held").await.unwrap().expect("free");
    fs::write(dir.join("notes.txt"), "not a lock file").unwrap();

    let pruned = backend.prune().await.unwrap();
    assert_eq!((pruned.removed, pruned.held, pruned.failed), (2, 1, 0));
    assert_eq!(
        names(&dir),
        ["a.fence", "b.fence", "held.fence", "held.lock", "notes.txt"]
    );
    // The held lock is untouched: still held, not lost, still excluding others.
    assert!(!held.is_lost());
    assert!(l.try_acquire("held").await.unwrap().is_none());
    // Tokens go on from the kept fence file.
    let again = l.try_acquire("a").await.unwrap().expect("free");
    assert!(again.fencing_token() > first);
    assert!(!backend.prune_key(&key("a")).await.unwrap(), "held");
    assert!(again.release().await.unwrap());
    assert!(backend.prune_key(&key("a")).await.unwrap());
    assert!(!dir.join("a.lock").exists() && dir.join("a.fence").exists());
    assert!(held.release().await.unwrap());
    fs::remove_dir_all(&dir).unwrap();
}

/// A semaphore's free slot files go with a prune; its held slots, fence and limit files stay,
/// and its tokens go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_deletes_free_permit_slots_and_keeps_held_ones_fence_and_limit() {
    let dir = fresh("permits");
    let backend = FileBackend::new(FileConfig::new(&dir)).unwrap();
    let sem = Semaphore::new(backend.clone(), 2).unwrap();
    let kept = sem.try_acquire("s").await.unwrap().expect("a free permit");
    let freed = sem.try_acquire("s").await.unwrap().expect("a free permit");
    let last = freed.fencing_token().unwrap();
    assert!(freed.release().await.unwrap());
    let slots = |names: &[String]| {
        names
            .iter()
            .filter(|n| n.starts_with("s~sem") && n.ends_with(".lock"))
            .count()
    };
    assert_eq!(slots(&names(&dir)), 2);

    let pruned = backend.prune().await.unwrap();
    assert_eq!((pruned.removed, pruned.held, pruned.failed), (1, 1, 0));
    let left = names(&dir);
    assert_eq!(slots(&left), 1, "{left:?}");
    assert!(
        left.contains(&"s~sem.fence".to_owned()) && left.contains(&"s~sem.limit".to_owned()),
        "{left:?}"
    );
    // The held permit still excludes: one more is free, not two.
    assert!(!kept.is_lost());
    let again = sem
        .try_acquire("s")
        .await
        .unwrap()
        .expect("the freed permit");
    assert!(again.fencing_token().unwrap() > last);
    assert!(
        sem.try_acquire("s").await.unwrap().is_none(),
        "only 2 permits"
    );
    assert!(again.release().await.unwrap() && kept.release().await.unwrap());
    fs::remove_dir_all(&dir).unwrap();
}

/// Holders of one key in two "processes" (two backends) take and give back the lock in a loop
/// while a third prunes the folder as fast as it can: an acquirer that opened a lock file just
/// before it was unlinked must not end up holding a deleted file beside a holder of the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn pruning_while_others_lock_never_lets_two_holders_in() {
    let dir = fresh("race");
    let pruner = FileBackend::new(FileConfig::new(&dir)).unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let (overlaps, taken) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let l = locker(FileBackend::new(FileConfig::new(&dir)).unwrap());
        let (inside, overlaps, taken, stop) = (
            inside.clone(),
            overlaps.clone(),
            taken.clone(),
            stop.clone(),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let Some(lease) = l.try_acquire("k").await.unwrap() else {
                    tokio::task::yield_now().await;
                    continue;
                };
                if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                    overlaps.fetch_add(1, Ordering::SeqCst);
                }
                taken.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_micros(200)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                lease.release().await.unwrap();
            }
        }));
    }
    let mut pruners = Vec::new();
    for _ in 0..2 {
        let pruner = pruner.clone();
        pruners.push(tokio::spawn(async move {
            let mut removed = 0;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
            while tokio::time::Instant::now() < deadline {
                removed += usize::from(pruner.prune_key(&key("k")).await.unwrap());
            }
            removed
        }));
    }
    let mut removed = 0;
    for p in pruners {
        removed += p.await.unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }
    let taken = taken.load(Ordering::SeqCst);
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
    assert!(removed > 0 && taken > 0, "removed {removed}, taken {taken}");
    fs::remove_dir_all(&dir).unwrap();
}
