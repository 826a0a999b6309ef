//! `leasehold acquire`, `release` and `status` end to end on the local file backend: the
//! holder process, its state file, `eval` in a real shell, a lost lease, `--quiet`, and the
//! documented exit codes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;

fn url(dir: &std::path::Path) -> String {
    format!("file://{}", dir.join("locks").display())
}

#[tokio::test]
async fn acquire_status_release_round_trip() {
    let rt = folder("cli_hold_rt");
    let u = url(&rt);
    let out = on_key(&rt, "acquire", "deploy", &u, &[]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ex = exports(&out);
    assert_eq!(ex["LEASEHOLD_KEY"], "deploy");
    assert_eq!(ex["LEASEHOLD_BACKEND"], "file");
    assert_eq!(ex["LEASEHOLD_FENCING_TOKEN"], "1");
    let pid = holder_pid(&ex);
    let handle = ex["LEASEHOLD_HANDLE"].clone();
    assert!(alive(pid), "the holder outlives acquire");
    let state = std::fs::read_to_string(&handle).unwrap();
    assert!(state.contains("LEASEHOLD_STATE='held'"), "{state}");
    assert!(state.contains(&format!("LEASEHOLD_HOLDER_PID='{pid}'")));

    // What the backend tells.
    let st = on_key(&rt, "status", "deploy", &u, &["--json"]).await;
    assert_eq!(st.status.code(), Some(0), "{st:?}");
    let json = stdout(&st);
    assert!(json.contains("\"held\":true") && json.contains("\"fencing_token\":1"));
    assert!(json.contains(&format!("\"owner\":\"{}\"", owner_of(&state))));

    // Someone else: contention, then a timeout.
    let busy = on_key(&rt, "acquire", "deploy", &u, &["--no-wait"]).await;
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    assert!(stdout(&busy).is_empty(), "nothing to eval on failure");
    let t = Instant::now();
    let late = on_key(&rt, "acquire", "deploy", &u, &["--wait", "1500ms"]).await;
    assert_eq!(late.status.code(), Some(124), "{late:?}");
    assert!(t.elapsed() >= Duration::from_millis(1400));
    assert!(stderr(&late).contains("waiting up to 1s 500ms"), "{late:?}");
    // `run` on the same lock is excluded too.
    let run = run_true(&rt, "deploy", &u, &["--no-wait"]).await;
    assert_eq!(run.status.code(), Some(75));

    // Release through the handle; the holder exits and the files go.
    let rel = output(&rt, &["release", "--handle", &handle]).await;
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
    assert!(!alive(pid), "the holder is gone when release returns");
    assert!(!std::path::Path::new(&handle).exists());
    let st = on_key(&rt, "status", "deploy", &u, &[]).await;
    assert_eq!(st.status.code(), Some(1), "free: {st:?}");
    assert!(stdout(&st).contains("is free"));
    let again = output(&rt, &["release", "--key", "deploy"]).await;
    assert_eq!(again.status.code(), Some(1), "nothing left to release");

    // The next holder gets the next token.
    let out = on_key(&rt, "acquire", "deploy", &u, &[]).await;
    assert_eq!(exports(&out)["LEASEHOLD_FENCING_TOKEN"], "2");
    let rel = on_key(&rt, "release", "deploy", &u, &[]).await;
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
    let _ = std::fs::remove_dir_all(&rt);
}

fn owner_of(state: &str) -> String {
    state
        .lines()
        .find_map(|l| l.strip_prefix("LEASEHOLD_OWNER='"))
        .and_then(|v| v.strip_suffix('\''))
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn eval_in_a_shell_then_release_from_the_environment() {
    let rt = folder("cli_hold_eval");
    let u = url(&rt);
    let script = format!(
        r#"set -e
eval "$({BIN} acquire --key 'it'\''s mine' --url {u})"
echo "token=$LEASEHOLD_FENCING_TOKEN key=$LEASEHOLD_KEY"
sh -c 'echo "child sees $LEASEHOLD_FENCING_TOKEN"'
{BIN} release
echo released=$?"#
    );
    let out = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .env("LEASEHOLD_RUNTIME_DIR", &rt)
            .env_remove("LEASEHOLD_HANDLE")
            .output(),
    )
    .await
    .unwrap()
    .unwrap();
    // $(…) returned although the holder lives on: it does not keep acquire's stdout open.
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        stdout(&out),
        "token=1 key=it's mine\nchild sees 1\nreleased=0\n"
    );
    let st = on_key(&rt, "status", "it's mine", &u, &[]).await;
    assert_eq!(st.status.code(), Some(1));
    let _ = std::fs::remove_dir_all(&rt);
}

#[tokio::test]
async fn a_lost_lease_ends_the_holder_and_release_says_so() {
    let rt = folder("cli_hold_lost");
    let u = url(&rt);
    let out = on_key(&rt, "acquire", "k", &u, &[]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ex = exports(&out);
    let pid = holder_pid(&ex);
    // Someone deletes the lock file: the file backend notices within a second.
    std::fs::remove_file(rt.join("locks").join("k.lock")).unwrap();
    eventually("the holder exits", Duration::from_secs(10), || !alive(pid)).await;
    let state = std::fs::read_to_string(&ex["LEASEHOLD_HANDLE"]).unwrap();
    assert!(state.contains("LEASEHOLD_STATE='lost'"), "{state}");
    let rel = output(&rt, &["release", "--key", "k"]).await;
    assert_eq!(rel.status.code(), Some(79), "{rel:?}");
    assert!(stderr(&rel).contains("was lost"), "{rel:?}");
    // The record is gone once reported.
    let rel = output(&rt, &["release", "--key", "k"]).await;
    assert_eq!(rel.status.code(), Some(1));
    let _ = std::fs::remove_dir_all(&rt);
}

#[tokio::test]
async fn sigterm_to_the_holder_releases() {
    let rt = folder("cli_hold_term");
    let u = url(&rt);
    let out = on_key(&rt, "acquire", "k", &u, &[]).await;
    let ex = exports(&out);
    let pid = holder_pid(&ex);
    let st = on_key(&rt, "status", "k", &u, &[]).await;
    assert_eq!(st.status.code(), Some(0));
    std::process::Command::new("kill")
        .arg(pid.to_string())
        .status()
        .unwrap();
    eventually("the holder exits", Duration::from_secs(10), || !alive(pid)).await;
    let st = on_key(&rt, "status", "k", &u, &[]).await;
    assert_eq!(st.status.code(), Some(1), "released on SIGTERM: {st:?}");
    assert!(!std::path::Path::new(&ex["LEASEHOLD_HANDLE"]).exists());
    let _ = std::fs::remove_dir_all(&rt);
}

#[tokio::test]
async fn quiet_silences_the_wait_notice() {
    let rt = folder("cli_hold_quiet");
    let u = url(&rt);
    let out = on_key(&rt, "acquire", "q", &u, &[]).await;
    let handle = exports(&out)["LEASEHOLD_HANDLE"].clone();
    for cmd in [
        vec!["acquire", "--key", "q", "--url", &u, "--wait", "1200ms"],
        vec![
            "run", "--key", "q", "--url", &u, "--wait", "1200ms", "--", "true",
        ],
    ] {
        let loud = output(&rt, &cmd).await;
        assert_eq!(loud.status.code(), Some(124));
        assert!(stderr(&loud).contains("waiting up to"), "{loud:?}");
        let mut quiet = cmd.clone();
        quiet.insert(1, "--quiet");
        let quiet = output(&rt, &quiet).await;
        assert_eq!(quiet.status.code(), Some(124));
        assert!(!stderr(&quiet).contains("waiting"), "{quiet:?}");
        assert!(
            stderr(&quiet).contains("timed out"),
            "errors still show: {quiet:?}"
        );
    }
    // A short wait that succeeds says nothing either.
    let rel = output(&rt, &["release", "--handle", &handle]).await;
    assert_eq!(rel.status.code(), Some(0));
    let fast = on_key(&rt, "run", "q", &u, &["--", "true"]).await;
    assert_eq!(fast.status.code(), Some(0));
    assert!(stderr(&fast).is_empty(), "{fast:?}");
    let _ = std::fs::remove_dir_all(&rt);
}

#[tokio::test]
async fn bad_input_gives_the_documented_codes() {
    let rt = folder("cli_hold_bad");
    // Usage errors: 2.
    for args in [
        vec!["acquire"],
        vec!["acquire", "--key", "k", "--wait", "1s", "--no-wait"],
        vec![
            "acquire",
            "--key",
            "k",
            "--url",
            "file:///x",
            "--config",
            "c.toml",
        ],
        vec!["status"],
        vec!["status", "--key", "k", "--ttl", "1s"],
        vec!["release"],
        vec!["release", "--url", "file:///x"],
        vec!["release", "--key", "k", "--handle", "/x"],
        vec!["nosuch"],
    ] {
        let out = output(&rt, &args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
    // Configuration errors: 78, never showing the password.
    for cmd in ["acquire", "status"] {
        let out = output(&rt, &[cmd, "--key", "k", "--url", "nosuch://u:s3cret@h"]).await;
        assert_eq!(out.status.code(), Some(78), "{cmd}: {out:?}");
        let err = stderr(&out);
        assert!(err.contains("scheme") && !err.contains("s3cret"), "{err}");
    }
    let out = output(&rt, &["acquire", "--key", "", "--url", "memory://"]).await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    // A configuration that requires correctness refuses the file backend, saying why.
    let cfg = rt.join("locks.toml");
    std::fs::write(
        &cfg,
        format!("url = \"{}\"\nrequire = \"correctness\"\n", url(&rt)),
    )
    .unwrap();
    let cfg = cfg.to_str().unwrap();
    for cmd in ["acquire", "status"] {
        let out = output(&rt, &[cmd, "--key", "k", "--config", cfg]).await;
        assert_eq!(out.status.code(), Some(78), "{cmd}: {out:?}");
        assert!(stderr(&out).contains("only on one host"), "{out:?}");
    }
    let out = output(&rt, &["run", "--key", "k", "--config", cfg, "--", "true"]).await;
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    // No holder: 1.
    let out = output(&rt, &["release", "--key", "none"]).await;
    assert_eq!(out.status.code(), Some(1));
    let _ = std::fs::remove_dir_all(&rt);
}

#[tokio::test]
async fn leasehold_url_names_the_backend_when_no_flag_does() {
    let rt = folder("cli_hold_env");
    let u = url(&rt);
    let out = lh(&rt, &["acquire", "--key", "from-env"])
        .env("LEASEHOLD_URL", &u)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        rt.join("locks").join("from-env.lock").exists(),
        "locked in $LEASEHOLD_URL's folder"
    );
    let st = on_key(&rt, "status", "from-env", &u, &[]).await;
    assert_eq!(st.status.code(), Some(0), "{st:?}");
    // release --url finds the holder by that location.
    let rel = on_key(&rt, "release", "from-env", &u, &[]).await;
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
    let _ = std::fs::remove_dir_all(&rt);
}

#[tokio::test]
async fn flock_takes_the_same_lock_as_the_guide_shows() {
    let rt = folder("cli_hold_flock");
    let u = url(&rt);
    let dir = rt.join("locks");
    std::fs::create_dir_all(&dir).unwrap();
    let lock = dir.join("nightly.lock");
    // flock(1) holds it: leasehold sees it held.
    let mut by_hand = tokio::process::Command::new("flock")
        .arg("-n")
        .arg(&lock)
        .args(["-c", "echo locked; sleep 3"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(
        &mut tokio::io::BufReader::new(by_hand.stdout.take().unwrap()),
        &mut line,
    )
    .await
    .unwrap();
    assert_eq!(line.trim(), "locked");
    let out = run_true(&rt, "nightly", &u, &["--no-wait"]).await;
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(by_hand.wait().await.unwrap().success());
    // leasehold holds it: flock -n fails (exit 1).
    let out = on_key(&rt, "acquire", "nightly", &u, &[]).await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(flock_try(&lock), Some(1));
    let rel = output(&rt, &["release", "--key", "nightly"]).await;
    assert_eq!(rel.status.code(), Some(0));
    assert_eq!(flock_try(&lock), Some(0));
    let _ = std::fs::remove_dir_all(&rt);
}

/// `flock -n LOCK true`: its exit code (1 while someone holds the lock).
fn flock_try(lock: &std::path::Path) -> Option<i32> {
    std::process::Command::new("flock")
        .arg("-n")
        .arg(lock)
        .args(["-c", "true"])
        .status()
        .unwrap()
        .code()
}

#[tokio::test]
async fn a_holder_whose_acquire_was_killed_gives_the_lock_back() {
    let rt = folder("cli_hold_orphan");
    let u = url(&rt);
    let first = on_key(&rt, "acquire", "k", &u, &[]).await;
    let first = exports(&first);
    // A second acquire waits; its caller is killed (Ctrl-C in a terminal kills the acquire
    // process, not the holder in its own process group).
    let mut waiting = lh(
        &rt,
        &["acquire", "--key", "k", "--url", &u, "--wait", "30s"],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    waiting.start_kill().unwrap();
    let _ = waiting.wait().await;
    // The first gives the lock up; the orphaned holder gets it, cannot report, gives it back.
    let rel = output(&rt, &["release", "--handle", &first["LEASEHOLD_HANDLE"]]).await;
    assert_eq!(rel.status.code(), Some(0));
    let t0 = Instant::now();
    loop {
        let st = on_key(&rt, "status", "k", &u, &["--json"]).await;
        let fence = std::fs::read_to_string(rt.join("locks").join("k.fence")).unwrap_or_default();
        // Token 2 was minted: the orphan did take the lock; now it is free again.
        if fence.trim() == "2" && st.status.code() == Some(1) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the orphan keeps the lock: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leftovers: Vec<_> = std::fs::read_dir(&rt)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.path()
                .extension()
                .is_some_and(|x| x == "state" || x == "sock")
        })
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let _ = std::fs::remove_dir_all(&rt);
}
