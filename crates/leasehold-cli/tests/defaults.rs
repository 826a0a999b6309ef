//! What `leasehold run` does when nothing is said: the default lock folder (no `--url`), and
//! the SIGKILL that follows `--grace` when a lost lease's command ignores SIGTERM.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Running, alive, eventually, folder, lh, stdout};
use leasehold_test_support::services::unique_prefix;

/// Our user id, as `id -u` says.
fn uid() -> u32 {
    let out = std::process::Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// Processes (not zombies) whose process group is `pgid`.
fn group_members(pgid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // After the command name: state, ppid, pgrp.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, r)| r)
            .split_whitespace()
            .collect();
        if fields.get(2) == Some(&pgid.to_string().as_str())
            && !matches!(fields.first(), Some(&"Z" | &"X"))
        {
            found.push(pid);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_ignores_sigterm_is_killed_after_the_grace_period() {
    let rt = folder("grace_rt");
    let dir = folder("grace_locks");
    let url = format!("file://{}", dir.display());
    // The shell and its `sleep`s ignore SIGTERM (an ignored signal stays ignored across exec).
    let run = Running::start(
        &rt,
        &[
            "run",
            "--key",
            "k",
            "--url",
            &url,
            "--grace",
            "2s",
            "--",
            "sh",
            "-c",
            "trap '' TERM; echo $$; while true; do sleep 0.1; done",
        ],
    )
    .await;
    let leader: u32 = run.first_line.parse().expect("the shell's pid");
    assert!(
        !group_members(leader).is_empty(),
        "the command leads its group"
    );
    // Someone deletes the lock file: the lease is lost at the next check (within a second).
    std::fs::remove_file(dir.join("k.lock")).unwrap();
    let t = Instant::now();
    let (code, _, err) = run.finish(Duration::from_secs(30)).await;
    let took = t.elapsed();
    assert_eq!(code, Some(79), "{err}");
    assert!(err.contains("lost"), "{err}");
    // SIGTERM changed nothing: the end came from SIGKILL, after the 2 s grace.
    assert!(took >= Duration::from_secs(2), "ended after {took:?}");
    assert!(took < Duration::from_secs(20), "ended after {took:?}");
    assert!(!alive(leader));
    eventually("the whole group is gone", Duration::from_secs(5), || {
        group_members(leader).is_empty()
    })
    .await;
}

/// Runs `leasehold run --key KEY` (no `--url`, no `LEASEHOLD_*` location) with `HOME`,
/// `TMPDIR` and the `XDG_*` folders pointing into `decoy`; the command prints its location,
/// its token, and whether `flock(1)` finds `lock` taken.
async fn run_without_url(rt: &Path, decoy: &Path, key: &str, lock: &Path) -> String {
    let mut cmd = lh(
        rt,
        &[
            "run",
            "--key",
            key,
            "--",
            "sh",
            "-c",
            "echo \"$LEASEHOLD_LOCATION $LEASEHOLD_FENCING_TOKEN\"; \
             if flock -n \"$1\" true; then echo free; else echo held; fi",
            "sh",
            lock.to_str().unwrap(),
        ],
    );
    for var in [
        "LEASEHOLD_DIR",
        "LEASEHOLD_URL",
        "LEASEHOLD_URLS",
        "LEASEHOLD_CONFIG",
    ] {
        cmd.env_remove(var);
    }
    for var in [
        "HOME",
        "TMPDIR",
        "XDG_RUNTIME_DIR",
        "XDG_STATE_HOME",
        "XDG_DATA_HOME",
        "XDG_CACHE_HOME",
    ] {
        cmd.env(var, decoy);
    }
    let out = cmd.output().await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    stdout(&out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_url_locks_live_in_the_per_user_folder_whatever_home_and_tmpdir_say() {
    let rt = folder("default_rt");
    let key = unique_prefix("default-folder");
    let dir = PathBuf::from(format!("/var/tmp/leasehold-{}", uid()));
    let lock = dir.join(format!("{key}.lock"));
    let mut tokens = Vec::new();
    for context in ["shell", "cron"] {
        let decoy = folder(&format!("decoy_{context}"));
        let out = run_without_url(&rt, &decoy, &key, &lock).await;
        let lines: Vec<&str> = out.lines().collect();
        let (location, token) = lines[0].rsplit_once(' ').expect("location and token");
        assert_eq!(location, format!("file://{}", dir.display()), "{out}");
        tokens.push(token.parse::<u64>().expect("a token"));
        // flock(1) on the documented path meets our lock while the command runs.
        assert_eq!(lines.get(1), Some(&"held"), "{out}");
        // Nothing went into the decoy folders.
        assert_eq!(std::fs::read_dir(&decoy).unwrap().count(), 0, "{context}");
    }
    // Both contexts used one folder: the second run's token follows the first's.
    assert_eq!(tokens[1], tokens[0] + 1, "{tokens:?}");
    let meta = std::fs::symlink_metadata(&dir).unwrap();
    assert!(meta.is_dir() && meta.uid() == uid(), "{meta:?}");
    assert_eq!(meta.mode() & 0o777, 0o700);
    for ext in ["lock", "fence"] {
        let _ = std::fs::remove_file(dir.join(format!("{key}.{ext}")));
    }
}
