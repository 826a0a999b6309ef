//! `leasehold run` end to end, on the local file backend: the command's environment and exit
//! status, two runs on one key, a lease lost mid-run, and the documented exit codes.

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::expect_used)]

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use tokio::process::Command;

mod common;

use common::{BIN, Running, folder};

fn url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

fn leasehold(args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args).stdin(Stdio::null()).kill_on_drop(true);
    c
}

async fn output(args: &[&str]) -> Output {
    leasehold(args).output().await.expect("leasehold runs")
}

#[tokio::test]
async fn the_command_gets_the_lease_in_its_environment_and_its_status_is_ours() {
    let dir = folder("cli_env");
    let u = url(&dir);
    let out = output(&[
        "run",
        "--key",
        "nightly",
        "--url",
        &u,
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_KEY $LEASEHOLD_BACKEND $LEASEHOLD_FENCING_TOKEN; exit 3",
    ])
    .await;
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "nightly file 1"
    );
    // The token goes up on the next run.
    let out = output(&[
        "run",
        "--key",
        "nightly",
        "--url",
        &u,
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCING_TOKEN",
    ])
    .await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "2");
    // A command killed by a signal: 128 + the signal, as shells report it.
    let out = output(&[
        "run",
        "--key",
        "nightly",
        "--url",
        &u,
        "--",
        "sh",
        "-c",
        "kill -9 $$",
    ])
    .await;
    assert_eq!(out.status.code(), Some(128 + 9));
}

#[tokio::test]
async fn a_second_run_fails_waits_or_times_out_as_its_flags_say() {
    let dir = folder("cli_two");
    let u = url(&dir);
    // Held 8 s: the three runs below (each a process start of a debug build; over 1 s each
    // on a loaded machine) must all start while it is held.
    let hold = Duration::from_secs(8);
    let started = Instant::now();
    // Its command runs only once the lock is held (the lock file exists a moment before).
    let first = Running::start(
        &dir,
        &[
            "run",
            "--key",
            "k",
            "--url",
            &u,
            "--",
            "sh",
            "-c",
            "echo held; exec sleep 8",
        ],
    )
    .await;
    assert_eq!(first.first_line, "held", "the first run never locked");

    let out = output(&["run", "--key", "k", "--url", &u, "--no-wait", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(75), "contention: {out:?}");
    assert!(
        started.elapsed() < hold,
        "--no-wait returned after the first run let go: it waited"
    );

    let out = output(&[
        "run", "--key", "k", "--url", &u, "--wait", "300ms", "--", "true",
    ])
    .await;
    assert_eq!(out.status.code(), Some(124), "timeout: {out:?}");

    let out = output(&[
        "run", "--key", "k", "--url", &u, "--wait", "20s", "--", "echo", "second",
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "second");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("waiting up to"),
        "said it waits"
    );
    assert!(started.elapsed() >= hold, "it ran before the first let go");
    let (code, _, _) = first.finish(Duration::from_secs(20)).await;
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn a_lost_lease_terminates_the_command() {
    let dir = folder("cli_lost");
    let u = url(&dir);
    let run = leasehold(&[
        "run",
        "--key",
        "k",
        "--url",
        &u,
        "--grace",
        "2s",
        "--",
        "sh",
        "-c",
        "trap 'echo got TERM; exit 0' TERM; while true; do sleep 0.1; done",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let lock = dir.join("k.lock");
    let t0 = Instant::now();
    while !lock.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10), "never locked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Someone deletes the lock file: the lease is lost (the file backend checks every second).
    std::fs::remove_file(&lock).unwrap();
    let t = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(10), run.wait_with_output())
        .await
        .expect("leasehold stops the command")
        .unwrap();
    assert_eq!(out.status.code(), Some(79), "{out:?}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "got TERM");
    assert!(String::from_utf8_lossy(&out.stderr).contains("lost"));
}

#[tokio::test]
async fn bad_input_gives_the_documented_codes() {
    // Usage errors: clap's 2.
    assert_eq!(output(&["run", "--key", "k"]).await.status.code(), Some(2));
    assert_eq!(output(&["run", "--", "true"]).await.status.code(), Some(2));
    assert_eq!(
        output(&[
            "run",
            "--key",
            "k",
            "--wait",
            "1s",
            "--no-wait",
            "--",
            "true"
        ])
        .await
        .status
        .code(),
        Some(2)
    );
    // Configuration errors: 78, naming the problem, never the password.
    let out = output(&[
        "run",
        "--key",
        "k",
        "--url",
        "nosuch://u:s3cret@h",
        "--",
        "true",
    ])
    .await;
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("scheme") && !err.contains("s3cret"), "{err}");
    let out = output(&["run", "--key", "", "--url", "memory://", "--", "true"]).await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    // A command that does not exist: 126.
    let dir = folder("cli_bad");
    let out = output(&[
        "run",
        "--key",
        "k",
        "--url",
        &url(&dir),
        "--",
        "/nonexistent/cmd",
    ])
    .await;
    assert_eq!(out.status.code(), Some(126));
}
