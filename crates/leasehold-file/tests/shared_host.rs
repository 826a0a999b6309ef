//! The file backend on a host shared with other users: planted links and files, folders that
//! others could tamper with, the per-user default folder and the opt-in shared folder.
//!
//! Tests that hand a file or folder to another user need root (to `chown` to `nobody`); run as
//! another user they check what they can and say what they skipped.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold_core::{ErrorKind, Locker};
use leasehold_file::{FileBackend, FileConfig};

use common::{fresh, key};

const NOBODY: u32 = 65534;

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

#[tokio::test]
async fn a_planted_symlink_is_refused_and_its_target_untouched() {
    let dir = fresh("symlink");
    let backend = FileBackend::new(FileConfig::new(&dir)).unwrap();
    let victim = fresh("victim");
    fs::write(&victim, "precious data\n").unwrap();
    let l = Locker::new(backend.clone());

    // The lock file is a link to the victim.
    symlink(&victim, backend.lock_path(&key("nightly"))).unwrap();
    let err = l.try_acquire(&key("nightly")).await.unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(l.inspect(&key("nightly")).await.is_err());

    // The fence file is a link to the victim (the lock file is genuine).
    symlink(&victim, dir.join("daily.fence")).unwrap();
    let err = l.try_acquire(&key("daily")).await.unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");

    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious data\n");
    // A dangling link is not followed either: nothing is created at its target.
    let absent = fresh("absent");
    symlink(&absent, backend.lock_path(&key("weekly"))).unwrap();
    assert!(l.try_acquire(&key("weekly")).await.is_err());
    assert!(!absent.exists());
    let _ = fs::remove_dir_all(&dir);
    let _ = fs::remove_file(&victim);
}

#[tokio::test]
async fn hard_links_fifos_and_files_of_others_are_never_written() {
    let dir = fresh("planted");
    let backend = FileBackend::new(FileConfig::new(&dir)).unwrap();
    let l = Locker::new(backend.clone());

    // A hard link to a file elsewhere.
    let victim = fresh("hardlinked");
    fs::write(&victim, "precious").unwrap();
    fs::hard_link(&victim, backend.lock_path(&key("linked"))).unwrap();
    let err = l.try_acquire(&key("linked")).await.unwrap_err();
    assert!(err.to_string().contains("hard links"), "{err}");
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");

    // A FIFO (opening it must not block either).
    nix::unistd::mkfifo(
        &backend.lock_path(&key("fifo")),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), l.try_acquire(&key("fifo")))
        .await
        .expect("opening a FIFO does not block")
        .unwrap_err();
    assert!(err.to_string().contains("regular file"), "{err}");

    // A lock file of another user, in our folder.
    if euid() == 0 {
        let theirs = backend.lock_path(&key("theirs"));
        fs::write(&theirs, "their content").unwrap();
        chown(&theirs, NOBODY);
        let err = l.try_acquire(&key("theirs")).await.unwrap_err();
        assert!(err.to_string().contains("not to us"), "{err}");
        assert_eq!(fs::read_to_string(&theirs).unwrap(), "their content");
    } else {
        eprintln!("not root: the file-of-another-user case is skipped");
    }
    let _ = fs::remove_dir_all(&dir);
    let _ = fs::remove_file(&victim);
}

#[tokio::test]
async fn folders_others_could_tamper_with_are_refused() {
    // Open to everyone.
    let open = fresh("mode777");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let err = FileBackend::new(FileConfig::new(&open)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert!(err.to_string().contains("writable by other users"), "{err}");
    // Writable by the group.
    fs::set_permissions(&open, fs::Permissions::from_mode(0o770)).unwrap();
    assert!(FileBackend::new(FileConfig::new(&open)).is_err());
    // Closed again: accepted, and left as it was (readable is fine).
    fs::set_permissions(&open, fs::Permissions::from_mode(0o755)).unwrap();
    assert!(FileBackend::new(FileConfig::new(&open)).is_ok());
    assert_eq!(mode(&open), 0o755);

    // A symbolic link to a good folder.
    let link = fresh("dirlink");
    symlink(&open, &link).unwrap();
    let err = FileBackend::new(FileConfig::new(&link)).unwrap_err();
    assert!(err.to_string().contains("symbolic link"), "{err}");

    // A folder of another user (what a user who creates our default folder first leaves).
    let theirs = if euid() == 0 {
        let d = fresh("nobody");
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        chown(&d, NOBODY);
        d
    } else {
        PathBuf::from("/usr") // root's, and we are not root
    };
    let err = FileBackend::new(FileConfig::new(&theirs)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
    assert!(err.to_string().contains("not to us"), "{err}");
    if euid() == 0 {
        let _ = fs::remove_dir_all(&theirs);
    }
    let _ = fs::remove_file(&link);
    let _ = fs::remove_dir_all(&open);
}

#[tokio::test]
async fn new_folders_and_files_are_private() {
    let dir = fresh("private");
    let l = Locker::new(FileBackend::new(FileConfig::new(&dir)).unwrap());
    assert_eq!(mode(&dir), 0o700);
    let lease = l.try_acquire(&key("k")).await.unwrap().unwrap();
    assert_eq!(mode(&dir.join("k.lock")), 0o600);
    assert_eq!(mode(&dir.join("k.fence")), 0o600);
    lease.release().await.unwrap();
    let _ = fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_default_folder_is_per_user_and_private() {
    let dir = FileConfig::per_user_dir();
    assert_eq!(dir, PathBuf::from(format!("/var/tmp/leasehold-{}", euid())));
    if std::env::var_os("LEASEHOLD_DIR").is_none_or(|d| d.is_empty()) {
        assert_eq!(FileConfig::default_dir(), dir);
        assert_eq!(FileConfig::from_url("file://").unwrap().dir(), dir);
    }
    let l = Locker::new(FileBackend::new(FileConfig::new(&dir)).unwrap());
    let meta = fs::symlink_metadata(&dir).unwrap();
    assert!(meta.is_dir());
    assert_eq!(meta.uid(), euid());
    assert_eq!(meta.mode() & 0o777, 0o700, "{}", dir.display());
    let k = key(&format!("per-user-test-{}", std::process::id()));
    let lease = l.try_acquire(&k).await.unwrap().expect("free");
    lease.release().await.unwrap();
    let _ = fs::remove_file(dir.join(format!("{}.lock", k.as_str())));
    let _ = fs::remove_file(dir.join(format!("{}.fence", k.as_str())));
}

#[tokio::test]
async fn inspect_reads_a_bounded_amount() {
    let dir = fresh("bounded");
    let backend = FileBackend::new(FileConfig::new(&dir)).unwrap();
    let l = Locker::new(backend.clone());
    let lease = l.try_acquire(&key("k")).await.unwrap().unwrap();
    assert!(l.inspect(&key("k")).await.unwrap().is_some());
    // Someone writes a huge "owner" into the lock file: inspect refuses, reading little.
    fs::write(backend.lock_path(&key("k")), vec![b'x'; 1 << 20]).unwrap();
    let err = l.inspect(&key("k")).await.unwrap_err();
    assert!(err.to_string().contains("more than"), "{err}");
    lease.release().await.unwrap();
    // A huge fence file stops the next grant rather than being read whole.
    fs::write(dir.join("k.fence"), vec![b'7'; 1 << 20]).unwrap();
    let err = l.try_acquire(&key("k")).await.unwrap_err();
    assert!(err.to_string().contains("more than"), "{err}");
    let _ = fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_shared_folder_works_only_when_asked_for() {
    if euid() != 0 {
        eprintln!("not root: the shared folder (owned by nobody) is skipped");
        return;
    }
    // A folder of another user, writable by all with the sticky bit (as /tmp is).
    let dir = fresh("shared");
    fs::create_dir(&dir).unwrap();
    chown(&dir, NOBODY);
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).unwrap();
    let url = format!("file://{}", dir.display());
    assert!(FileBackend::new(FileConfig::from_url(&url).unwrap()).is_err());
    let shared = FileConfig::from_url(&format!("{url}?shared=true")).unwrap();
    assert!(shared.is_shared());
    let backend = FileBackend::new(shared.clone()).unwrap();
    // A lock file another user made is used, and ours are group-writable.
    let theirs = backend.lock_path(&key("theirs"));
    fs::write(&theirs, "").unwrap();
    chown(&theirs, NOBODY);
    let l = Locker::new(backend.clone());
    let lease = l.try_acquire(&key("theirs")).await.unwrap().expect("free");
    lease.release().await.unwrap();
    let lease = l.try_acquire(&key("ours")).await.unwrap().expect("free");
    assert_eq!(mode(&backend.lock_path(&key("ours"))), 0o660);
    lease.release().await.unwrap();
    // Links are still refused in a shared folder.
    symlink("/etc/hostname", backend.lock_path(&key("link"))).unwrap();
    assert!(l.try_acquire(&key("link")).await.is_err());
    // Writable by all without the sticky bit: refused even when shared.
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let err = FileBackend::new(shared).unwrap_err();
    assert!(err.to_string().contains("sticky"), "{err}");
    // Unknown options are refused.
    assert!(FileConfig::from_url(&format!("{url}?shared=maybe")).is_err());
    let _ = fs::remove_dir_all(&dir);
}
