//! The file backend and `flock(1)` take the same lock, across processes.

use std::process::Stdio;
use std::time::Duration;

use leasehold_core::{LockKey, Locker};
use leasehold_file::{FileBackend, FileConfig};
use leasehold_test_support::services::TempFolder;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flock_and_leasehold_exclude_each_other() {
    let dir = TempFolder::new("flock");
    let backend = FileBackend::new(FileConfig::new(&dir)).unwrap();
    let key = LockKey::new("nightly").unwrap();
    let path = backend.lock_path(&key);
    let l = Locker::new(backend);

    // Another process holds it with flock(1): we see it held, and who holds it is a process we
    // don't know.
    // `-o`: the lock stays with flock itself, not with the command it runs, so killing flock
    // releases it.
    let mut child = tokio::process::Command::new("flock")
        .arg("-o")
        .arg(&path)
        .args(["-c", "echo locked; sleep 5"])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("flock(1) runs");
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 7];
    tokio::io::AsyncReadExt::read_exact(&mut out, &mut buf)
        .await
        .unwrap();
    assert_eq!(&buf[..6], b"locked");
    assert!(l.try_acquire(&key).await.unwrap().is_none());
    let info = l.inspect(&key).await.unwrap().expect("held by flock(1)");
    assert!(info.detail.unwrap().contains("nightly.lock"));
    child.kill().await.unwrap();
    child.wait().await.unwrap();

    // The lock went with the process; now ours excludes `flock -n`.
    let lease = l.acquire(&key, Duration::from_secs(2)).await.unwrap();
    let status = tokio::process::Command::new("flock")
        .args(["-n"])
        .arg(&path)
        .arg("true")
        .status()
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1), "flock -n must find it locked");
    let info = l.inspect(&key).await.unwrap().expect("held by us");
    assert_eq!(info.owner.as_ref(), Some(lease.owner()));
    assert_eq!(info.fencing, lease.fencing_token());
    assert!(lease.release().await.unwrap());
    let status = tokio::process::Command::new("flock")
        .args(["-n"])
        .arg(&path)
        .arg("true")
        .status()
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0), "released: flock -n gets it");
    let _ = std::fs::remove_dir_all(&dir);
}
