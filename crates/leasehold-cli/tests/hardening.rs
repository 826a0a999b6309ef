//! What `leasehold` guards against on a shared host (the CLI's part of SECURITY.md):
//!
//! - `run` stops the command's whole process group on a lost lease, SIGKILLs it after
//!   `--grace`, and the command dies with `leasehold` (parent-death signal);
//! - the command inherits no backend credentials, and `--url` with a password is warned about;
//! - keys with control characters are refused; `release` touches only a holder's state file in
//!   a private runtime folder of ours;
//! - the CLI's default backend is the file backend in its default folder.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};

/// Waits until the file lock `<dir>/<key>.lock` exists, then deletes it: the file backend sees
/// its lease lost at its next check (every second).
async fn lose_file_lock(dir: &Path, key: &str) -> Instant {
    let lock = dir.join(format!("{key}.lock"));
    eventually("the lock file appears", Duration::from_secs(10), || {
        lock.exists()
    })
    .await;
    std::fs::remove_file(&lock).expect("delete the lock file");
    Instant::now()
}

/// `leasehold run --key k --url file://<dir> EXTRA… -- sh -c SCRIPT`, once SCRIPT printed its
/// first line.
async fn run_script(dir: &Path, extra: &[&str], script: &str) -> Running {
    let u = format!("file://{}", dir.display());
    let mut args = vec!["run", "--key", "k", "--url", &u];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    Running::start(dir, &args).await
}

/// The pids a command printed on its first line.
fn pids(line: &str) -> Vec<u32> {
    line.split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect()
}

/// The processes of `pids` still running after up to 10 s; those are killed (a failed test
/// leaves nothing behind).
async fn survivors(pids: &[u32]) -> Vec<u32> {
    let t0 = Instant::now();
    while pids.iter().any(|p| alive(*p)) && t0.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let left: Vec<u32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    for p in &left {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &p.to_string()])
            .stderr(std::process::Stdio::null())
            .status();
    }
    left
}

#[tokio::test]
async fn a_lost_lease_stops_the_commands_whole_process_group() {
    let dir = folder("cli_group");
    // A shell that starts a worker and waits for it: SIGTERM ends the shell; the worker goes
    // only if the signal reaches the process group.
    let run = run_script(&dir, &[], "sleep 600 >/dev/null & echo $!; wait").await;
    let worker = pids(&run.first_line);
    lose_file_lock(&dir, "k").await;
    let (code, _, err) = run.finish(Duration::from_secs(30)).await;
    assert_eq!(code, Some(79), "{err}");
    let left = survivors(&worker).await;
    assert!(
        left.is_empty(),
        "the command's worker outlived the lost lease"
    );
}

#[tokio::test]
async fn a_command_that_ignores_sigterm_is_killed_after_the_grace() {
    let dir = folder("cli_grace");
    // Both the shell and its worker ignore SIGTERM (an ignored signal stays ignored in
    // children).
    let script = "trap '' TERM; sleep 600 >/dev/null & echo $$ $!; while :; do sleep 0.1; done";
    let run = run_script(&dir, &["--grace", "1s"], script).await;
    let both = pids(&run.first_line);
    let t = lose_file_lock(&dir, "k").await;
    let (code, _, err) = run.finish(Duration::from_secs(30)).await;
    let took = t.elapsed();
    assert_eq!(code, Some(79), "{err}");
    assert!(err.contains("lost"), "{err}");
    // At least the grace (the loss is seen within a second of the deletion), and not much more.
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(15),
        "took {took:?}"
    );
    let left = survivors(&both).await;
    assert!(left.is_empty(), "still running: {left:?} of {both:?}");
}

#[tokio::test]
async fn the_command_dies_with_leasehold() {
    let dir = folder("cli_pdeath");
    let mut run = run_script(&dir, &[], "echo $$; while :; do sleep 0.1; done").await;
    let command = pids(&run.first_line);
    // SIGKILL: leasehold cannot do anything about it; the kernel must.
    run.child.start_kill().expect("kill leasehold");
    let _ = run.child.wait().await;
    let left = survivors(&command).await;
    assert!(left.is_empty(), "the command outlived leasehold");
}

#[tokio::test]
async fn the_command_has_its_own_process_group_except_in_a_terminals_foreground() {
    let dir = folder("cli_pgid");
    let u = format!("file://{}", dir.display());
    // `$((…))` drops the spaces `ps` pads with; no quotes, so it nests in '…' below.
    let show = "echo pid=$$ pgid=$(($(ps -o pgid= -p $$)))";
    // No terminal (cron, CI): a group of its own, led by the command.
    let out = on_key(&dir, "run", "k", &u, &["--", "sh", "-c", show]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let line = stdout(&out);
    let (pid, pgid) = line
        .trim()
        .strip_prefix("pid=")
        .and_then(|l| l.split_once(" pgid="))
        .expect("pid=… pgid=…");
    assert_eq!(pid, pgid, "{line}");
    // The foreground job of a terminal (script(1) gives it one): leasehold's own group, so the
    // command's group is not led by the command.
    let inner = format!(
        "{BIN} run --key k --url {u} -- sh -c '{show}'; echo leasehold-pgid=$(($(ps -o pgid= -p $$)))"
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .env("LEASEHOLD_RUNTIME_DIR", dir.path())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script(1) runs (util-linux)");
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    let field = |name: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("{name} in {text:?}"))
            .to_owned()
    };
    assert_ne!(field("pid="), field("pgid="), "{text}");
    assert_eq!(field("pgid="), field("leasehold-pgid="), "{text}");
}

#[tokio::test]
async fn the_command_inherits_no_backend_credentials() {
    let pg = require_service!(Service::Postgres);
    let url = pg.url().to_owned();
    assert_ne!(
        leasehold::redact(&url),
        url,
        "the test URL carries a password"
    );
    let rt = folder("cli_creds");
    let key = unique_prefix("creds");
    let show = "env | grep '^LEASEHOLD_' | sort";
    // The URL (with its password) in LEASEHOLD_URL, where the guide tells users to put it,
    // and another credential-looking variable.
    let out = lh(&rt, &["run", "--key", &key, "--", "sh", "-c", show])
        .env("LEASEHOLD_URL", &url)
        .env_remove("LEASEHOLD_URLS")
        .env("LEASEHOLD_DEPLOY_TOKEN", "tok-marker")
        .output()
        .await
        .expect("leasehold runs");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let env = stdout(&out);
    let location = format!("LEASEHOLD_LOCATION={}", leasehold::redact(&url));
    assert!(env.lines().any(|l| l == location), "{env}");
    assert!(env.contains("LEASEHOLD_BACKEND=postgres"), "{env}");
    for secret in [
        "LEASEHOLD_URL=",
        "LEASEHOLD_DEPLOY_TOKEN",
        "tok-marker",
        &url,
    ] {
        assert!(
            !env.contains(secret),
            "{secret:?} reached the command:\n{env}"
        );
    }
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));

    // With --url: it works, with a warning that points to the safer places.
    let out = on_key(&rt, "run", &key, &url, &["--", "sh", "-c", show]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let err = stderr(&out);
    assert!(
        err.contains("warning") && err.contains("--config") && err.contains("LEASEHOLD_URL"),
        "{err}"
    );
    assert!(!err.contains(&url), "{err}");
    assert!(!stdout(&out).contains(&url), "{}", stdout(&out));
}

#[tokio::test]
async fn keys_with_control_characters_are_refused() {
    let redis = require_service!(Service::Redis);
    let url = redis.url().to_owned();
    let rt = folder("cli_ctl_key");
    // Today's state file is `LEASEHOLD_KEY='…'` lines: a newline would add a line of its own.
    let forged = format!("{}\nLEASEHOLD_STATE='lost'", unique_prefix("k"));
    for verb in ["acquire", "status"] {
        let out = on_key(&rt, verb, &forged, &url, &[]).await;
        assert_eq!(out.status.code(), Some(2), "{verb}: {out:?}");
        assert!(stderr(&out).contains("control"), "{}", stderr(&out));
    }
    let out = on_key(&rt, "run", "a\u{1b}[2Jb", &url, &["--", "true"]).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = output(&rt, &["release", "--key", "a\rb"]).await;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let left: Vec<_> = std::fs::read_dir(&rt).unwrap().collect();
    assert!(left.is_empty(), "nothing is recorded: {left:?}");
}

/// A dead holder's record, as a holder writes it.
fn dead_record(key: &str) -> String {
    format!(
        "LEASEHOLD_STATE='held'\nLEASEHOLD_KEY='{key}'\nLEASEHOLD_BACKEND='file'\n\
         LEASEHOLD_HOLDER_PID='999999999'\nLEASEHOLD_ACQUIRED_AT='1'\n"
    )
}

#[tokio::test]
async fn release_touches_only_a_holders_state_file_in_a_private_folder_of_ours() {
    let rt = folder("cli_handle");
    let release = |h: &Path| {
        let h = h.display().to_string();
        let rt = rt.path().to_owned();
        async move { output(&rt, &["release", "--handle", &h]).await }
    };
    // Any other file that reads like a record: refused, kept.
    let notes = rt.join("notes.txt");
    std::fs::write(&notes, dead_record("k")).unwrap();
    let out = release(&notes).await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(notes.exists(), "release deleted {}", notes.display());

    // A state file in a folder others can write to: refused, kept.
    let open = rt.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let in_open = open.join("123.state");
    std::fs::write(&in_open, dead_record("k")).unwrap();
    let out = release(&in_open).await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(in_open.exists(), "release deleted {}", in_open.display());

    // A symbolic link named like a state file: not followed, neither it nor its target goes.
    let link = rt.join("124.state");
    std::os::unix::fs::symlink(&notes, &link).unwrap();
    let out = release(&link).await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(
        notes.exists() && link.symlink_metadata().is_ok(),
        "a file was deleted"
    );

    // A real record of a dead holder: reported (79) and consumed, but a file planted under its
    // socket's name is not a socket and stays.
    let record = rt.join("125.state");
    std::fs::write(&record, dead_record("k")).unwrap();
    let planted = rt.join("125.sock");
    std::fs::write(&planted, "not a socket").unwrap();
    let out = release(&record).await;
    assert_eq!(out.status.code(), Some(79), "{out:?}");
    assert!(!record.exists(), "the record is consumed");
    assert!(
        planted.exists(),
        "release deleted a file that is not a socket"
    );
}

#[tokio::test]
async fn release_checks_the_runtime_folder_as_acquire_does() {
    let rt = folder("cli_release_rt");
    let key = unique_prefix("k");
    let record = rt.join("126.state");
    std::fs::write(&record, dead_record(&key)).unwrap();
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = output(&rt, &["release", "--key", &key]).await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    assert!(stderr(&out).contains("open to other users"), "{out:?}");
    assert!(
        record.exists(),
        "release deleted a record in a folder it refuses"
    );
    // The same folder made private again: the dead holder's record is reported and consumed.
    std::fs::set_permissions(&rt, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = output(&rt, &["release", "--key", &key]).await;
    assert_eq!(out.status.code(), Some(79), "{out:?}");
    assert!(!record.exists());
}

#[tokio::test]
async fn without_a_url_the_lock_is_a_file_lock_in_the_default_folder() {
    let rt = folder("cli_default_dir");
    let key = unique_prefix("default");
    let default_dir = leasehold::FileConfig::default_dir();
    let run = Running::start(
        &rt,
        &[
            "run",
            "--key",
            &key,
            "--",
            "sh",
            "-c",
            "echo \"$LEASEHOLD_BACKEND $LEASEHOLD_LOCATION\"; sleep 5",
        ],
    )
    .await;
    assert_eq!(
        run.first_line,
        format!("file file://{}", default_dir.display())
    );
    // The lock really is in that folder: taking it there by URL finds it held.
    let there = format!("file://{}", default_dir.display());
    let out = run_true(&rt, &key, &there, &["--no-wait"]).await;
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let (code, _, err) = run.finish(Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "{err}");
    for ext in ["lock", "fence"] {
        let _ = std::fs::remove_file(default_dir.join(format!("{key}.{ext}")));
    }
}
