//! `Locker::with_lock` and `Lease::run`: the work runs under the lease, a lost lease cancels it,
//! the lock is released after, and errors come back — on the memory backend and on real OS file
//! locks (the file backend, whose lease is lost when its lock file is deleted).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold_core::{ErrorKind, LockOptions, Locker, MemoryBackend, Renewal};
use leasehold_file::{FileBackend, FileConfig};
use tokio::time::Instant;

/// Sets its flag when dropped: shows that a cancelled work future was dropped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Two lockers on one backend, and a way to make a held lease of `key` lost.
struct Subject {
    locker: Locker,
    other: Locker,
    /// Makes the current holder of the key lose it (returns how long the loss may take to show).
    lose: Box<dyn Fn(&str) -> Duration + Send + Sync>,
}

/// Removes its folder when dropped: each file subject's folder goes with the test.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn options(ttl: Duration) -> LockOptions {
    LockOptions::default()
        .with_ttl(ttl)
        .with_renewal(Renewal::Off)
}

/// Memory: with renewal off, the lease is lost when its 300 ms TTL runs out.
fn memory() -> Subject {
    let backend = MemoryBackend::new();
    let opts = options(Duration::from_millis(300));
    Subject {
        locker: Locker::new(backend.clone())
            .with_options(opts.clone())
            .unwrap(),
        other: Locker::new(backend).with_options(opts).unwrap(),
        lose: Box::new(|_| Duration::from_millis(300)),
    }
}

fn fresh_dir() -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    std::env::temp_dir().join(format!(
        "leasehold-with-lock-{}-{nanos}",
        std::process::id()
    ))
}

/// File locks (a 30 s TTL the grant ignores): the lease is lost when its lock file is deleted.
/// The folder goes when the guard is dropped.
fn file() -> (Subject, RemoveDir) {
    let dir = fresh_dir();
    let config = FileConfig::new(dir.clone()).with_check_interval(Duration::from_millis(20));
    let (a, b) = (
        FileBackend::new(config.clone()).unwrap(),
        FileBackend::new(config).unwrap(),
    );
    let paths = a.clone();
    let opts = options(Duration::from_secs(30));
    let subject = Subject {
        locker: Locker::new(a).with_options(opts.clone()).unwrap(),
        other: Locker::new(b).with_options(opts).unwrap(),
        lose: Box::new(move |key| {
            std::fs::remove_file(paths.lock_path(&key.parse().unwrap())).unwrap();
            Duration::from_millis(20)
        }),
    };
    (subject, RemoveDir(dir))
}

async fn each_subject<F, Fut>(test: F)
where
    F: Fn(Subject) -> Fut,
    Fut: Future<Output = ()>,
{
    test(memory()).await;
    let (subject, dir) = file();
    test(subject).await;
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_runs_the_work_under_the_lease_and_releases_after() {
    each_subject(|s| async move {
        let other = s.other.clone();
        let out = s
            .locker
            .with_lock("k", Duration::from_secs(5), |info| async move {
                assert_eq!(info.key.as_str(), "k");
                assert!(info.fencing.is_some());
                // Held while the work runs.
                assert!(other.try_acquire("k").await.unwrap().is_none());
                Ok::<_, String>(7)
            })
            .await
            .unwrap();
        assert_eq!(out, Ok(7));
        let next = s.other.try_acquire("k").await.unwrap();
        assert!(
            next.expect("released after the work")
                .release()
                .await
                .unwrap()
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_lock_hands_back_the_works_error_and_the_acquire_error() {
    each_subject(|s| async move {
        // The work's own error comes back as its output, and the lock is released anyway.
        let out = s
            .locker
            .with_lock("k", Duration::from_secs(5), |_| async {
                Err::<(), _>("work failed")
            })
            .await
            .unwrap();
        assert_eq!(out, Err("work failed"));
        // A lock held elsewhere: the acquire's timeout comes back, and the work never runs.
        let held = s.other.try_acquire("k").await.unwrap().expect("released");
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let err = s
            .locker
            .with_lock("k", Duration::from_millis(200), |_| async move {
                flag.store(true, Ordering::SeqCst);
            })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
        assert!(!ran.load(Ordering::SeqCst));
        assert!(held.release().await.unwrap());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_cancels_the_work_of_with_lock_and_frees_the_key() {
    each_subject(|s| async move {
        let dropped = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        let (guard, done) = (DropFlag(dropped.clone()), finished.clone());
        let lose = tokio::spawn({
            let lose = s.lose;
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                lose("k")
            }
        });
        let started = Instant::now();
        let err = s
            .locker
            .with_lock("k", Duration::from_secs(5), |_| async move {
                let _guard = guard;
                tokio::time::sleep(Duration::from_secs(30)).await;
                done.store(true, Ordering::SeqCst);
            })
            .await
            .unwrap_err();
        let bound = lose.await.unwrap();
        assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
        // Cancelled soon after the loss (generous slack for loaded cores), never finished.
        assert!(started.elapsed() < Duration::from_secs(10) + bound);
        assert!(dropped.load(Ordering::SeqCst) && !finished.load(Ordering::SeqCst));
        let next = s.other.try_acquire("k").await.unwrap();
        assert!(next.expect("free after the loss").release().await.is_ok());
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_run_returns_the_output_or_the_loss() {
    each_subject(|s| async move {
        let lease = s.locker.try_acquire("k").await.unwrap().expect("free");
        assert_eq!(lease.run(async { 5 }).await.unwrap(), 5);
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = DropFlag(dropped.clone());
        (s.lose)("k");
        let err = lease
            .run(async move {
                let _guard = guard;
                std::future::pending::<()>().await;
            })
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
        assert!(dropped.load(Ordering::SeqCst));
        assert!(lease.is_lost());
        // Once lost, run refuses at once, without polling the work.
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let again = lease
            .run(async move { flag.store(true, Ordering::SeqCst) })
            .await;
        assert_eq!(again.unwrap_err().kind(), ErrorKind::LeaseLost);
        assert!(!ran.load(Ordering::SeqCst));
        drop(lease.release().await);
    })
    .await;
}
