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
lease=$({BIN} acquire --key 'it'\''s mine' --url {u}) || exit
eval "$lease"
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
    // The guide's form stops the script when the lock is not taken (`eval "$(…)"` would not).
    let held = exports(&on_key(&rt, "acquire", "busy", &u, &[]).await);
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            r#"lease=$({BIN} acquire --key busy --url {u} --no-wait) || exit
eval "$lease"
echo continued"#
        ))
        .env("LEASEHOLD_RUNTIME_DIR", &rt)
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(stdout(&out).is_empty(), "{out:?}");
    let rel = output(&rt, &["release", "--handle", &held["LEASEHOLD_HANDLE"]]).await;
    assert_eq!(rel.status.code(), Some(0));
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
        vec!["status", "--key", "k", "--ttl", "soon"],
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
async fn a_holder_whose_acquire_was_killed_gives_up_waiting() {
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
    let acquire_pid = waiting.id().unwrap();
    let orphan = eventually_child_of(acquire_pid).await;
    waiting.start_kill().unwrap();
    let _ = waiting.wait().await;
    // The orphaned holder sees its stdin closed and gives up without taking the lock.
    eventually("the orphan gives up", Duration::from_secs(5), || {
        !alive(orphan)
    })
    .await;
    let rel = output(&rt, &["release", "--handle", &first["LEASEHOLD_HANDLE"]]).await;
    assert_eq!(rel.status.code(), Some(0));
    let st = on_key(&rt, "status", "k", &u, &[]).await;
    assert_eq!(st.status.code(), Some(1), "free: {st:?}");
    let fence = std::fs::read_to_string(rt.join("locks").join("k.fence")).unwrap();
    assert_eq!(fence.trim(), "1", "the orphan never took the lock");
    assert!(leftovers(&rt).is_empty(), "{:?}", leftovers(&rt));
}

/// The state files and sockets in a runtime folder.
fn leftovers(rt: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(rt)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "state" || x == "sock"))
        .collect()
}

/// The pid of a child process of `parent` (the holder of an `acquire`), once there is one.
async fn eventually_child_of(parent: u32) -> u32 {
    let t0 = Instant::now();
    loop {
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(parent) {
                return pid;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no holder process");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `leasehold __hold` as `acquire` starts it, with its stdin and stdout ours: the `held` line.
async fn bare_holder(
    rt: &std::path::Path,
    key: &str,
    u: &str,
) -> (tokio::process::Child, Vec<String>) {
    let mut holder = lh(rt, &["__hold", "--key", key])
        .env("LEASEHOLD_HOLDER_URL", u)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = tokio::io::BufReader::new(holder.stdout.take().unwrap());
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line),
    )
    .await
    .unwrap()
    .unwrap();
    let fields: Vec<String> = line.trim().split('\t').map(str::to_owned).collect();
    assert_eq!(fields[0], "held", "{line:?}");
    // Keep the pipe open (a closed stdout is another way to tell the holder we are gone).
    std::mem::forget(out);
    (holder, fields)
}

#[tokio::test]
async fn a_holder_releases_unless_acquire_confirms_it_printed_the_handle() {
    let rt = folder("cli_hold_handshake");
    let u = url(&rt);
    // acquire died after the holder's `held` line, before printing: stdin closes without `ok`.
    let (mut holder, fields) = bare_holder(&rt, "hs", &u).await;
    let pid: u32 = fields[3].parse().unwrap();
    drop(holder.stdin.take());
    eventually(
        "the unconfirmed holder exits",
        Duration::from_secs(5),
        || !alive(pid),
    )
    .await;
    let st = on_key(&rt, "status", "hs", &u, &[]).await;
    assert_eq!(st.status.code(), Some(1), "given back: {st:?}");
    assert!(leftovers(&rt).is_empty(), "{:?}", leftovers(&rt));

    // Confirmed: it stays after its stdin closes, until released.
    let (mut holder, fields) = bare_holder(&rt, "hs", &u).await;
    let pid: u32 = fields[3].parse().unwrap();
    let mut stdin = holder.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, b"ok\n")
        .await
        .unwrap();
    drop(stdin);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(alive(pid), "a confirmed holder stays");
    let st = on_key(&rt, "status", "hs", &u, &[]).await;
    assert_eq!(st.status.code(), Some(0), "held: {st:?}");
    let rel = output(&rt, &["release", "--handle", &fields[4]]).await;
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
    let _ = holder.wait().await;
}

/// Acquires `key` and has its lease lost (the lock file deleted); the handle, once the holder
/// has recorded the loss and exited.
async fn acquire_then_lose(rt: &std::path::Path, key: &str, u: &str) -> String {
    let out = on_key(rt, "acquire", key, u, &[]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ex = exports(&out);
    let pid = holder_pid(&ex);
    std::fs::remove_file(rt.join("locks").join(format!("{key}.lock"))).unwrap();
    eventually("the holder exits", Duration::from_secs(10), || !alive(pid)).await;
    ex["LEASEHOLD_HANDLE"].clone()
}

#[tokio::test]
async fn a_new_holder_keeps_the_records_of_lost_and_dead_holds() {
    let rt = folder("cli_hold_records");
    let u = url(&rt);
    // A loses its lease; B takes the lock: A's record stays, A's release says lost (79).
    let a = acquire_then_lose(&rt, "deploy", &u).await;
    let b = exports(&on_key(&rt, "acquire", "deploy", &u, &[]).await);
    assert!(std::path::Path::new(&a).exists(), "A's record is kept");
    let rel = output(&rt, &["release", "--handle", &a]).await;
    assert_eq!(rel.status.code(), Some(79), "{rel:?}");
    assert!(stderr(&rel).contains("was lost"), "{rel:?}");
    assert!(
        !std::path::Path::new(&a).exists(),
        "consumed by its release"
    );
    assert!(alive(holder_pid(&b)), "B untouched");

    // B loses too; C takes it. `release --key` reports B's loss, not C's lock.
    std::fs::remove_file(rt.join("locks").join("deploy.lock")).unwrap();
    eventually("B exits", Duration::from_secs(10), || {
        !alive(holder_pid(&b))
    })
    .await;
    let c = exports(&on_key(&rt, "acquire", "deploy", &u, &[]).await);
    let rel = output(&rt, &["release", "--key", "deploy"]).await;
    assert_eq!(rel.status.code(), Some(79), "{rel:?}");
    assert!(alive(holder_pid(&c)), "C keeps the lock mid-deploy");
    let st = on_key(&rt, "status", "deploy", &u, &[]).await;
    assert_eq!(st.status.code(), Some(0), "{st:?}");

    // C's holder dies (kill -9) and D takes the lock: --key reports the dead holder (79).
    std::process::Command::new("kill")
        .args(["-9", &holder_pid(&c).to_string()])
        .status()
        .unwrap();
    eventually("C dies", Duration::from_secs(5), || !alive(holder_pid(&c))).await;
    let d = exports(&on_key(&rt, "acquire", "deploy", &u, &[]).await);
    let rel = output(&rt, &["release", "--key", "deploy"]).await;
    assert_eq!(rel.status.code(), Some(79), "{rel:?}");
    assert!(stderr(&rel).contains("gone without releasing"), "{rel:?}");
    assert!(alive(holder_pid(&d)));

    // Two live holders of "deploy" (two backends): --key alone refuses (2), --url picks.
    let u2 = format!("file://{}", rt.join("other").display());
    let e = exports(&on_key(&rt, "acquire", "deploy", &u2, &[]).await);
    let rel = output(&rt, &["release", "--key", "deploy"]).await;
    assert_eq!(rel.status.code(), Some(2), "{rel:?}");
    assert!(stderr(&rel).contains("--handle"), "{rel:?}");
    assert!(alive(holder_pid(&d)) && alive(holder_pid(&e)));
    let rel = on_key(&rt, "release", "deploy", &u2, &[]).await;
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
    let rel = output(&rt, &["release", "--key", "deploy"]).await;
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
    assert!(leftovers(&rt).is_empty(), "{:?}", leftovers(&rt));
}

#[tokio::test]
async fn a_release_that_meets_a_loss_in_progress_reports_the_loss() {
    // A holder busy losing its lease: it takes the connection, records the loss, and goes
    // without answering. `release` re-reads the record: 79, not 69.
    let rt = folder("cli_hold_midloss");
    let handle = rt.join("4242.state");
    let held = format!(
        "LEASEHOLD_STATE='held'\nLEASEHOLD_KEY='k'\nLEASEHOLD_HOLDER_PID='{}'\n",
        std::process::id()
    );
    std::fs::write(&handle, &held).unwrap();
    let listener = tokio::net::UnixListener::bind(rt.join("4242.sock")).unwrap();
    let release = lh(&rt, &["release", "--handle", handle.to_str().unwrap()]).output();
    let fake = async {
        let (conn, _) = listener.accept().await.unwrap();
        let mut line = String::new();
        let mut r = tokio::io::BufReader::new(conn);
        tokio::io::AsyncBufReadExt::read_line(&mut r, &mut line)
            .await
            .unwrap();
        assert_eq!(line, "release\n");
        std::fs::write(
            &handle,
            held.replace("'held'", "'lost'") + "LEASEHOLD_LOST_REASON='renewal failed'\n",
        )
        .unwrap();
        drop(r);
    };
    let (rel, ()) = tokio::join!(release, fake);
    let rel = rel.unwrap();
    assert_eq!(rel.status.code(), Some(79), "{rel:?}");
    assert!(stderr(&rel).contains("renewal failed"), "{rel:?}");
    assert!(!handle.exists(), "the record is consumed");
}

#[tokio::test]
async fn an_unsafe_runtime_folder_is_refused_and_a_relative_one_made_absolute() {
    use std::os::unix::fs::PermissionsExt;
    let base = folder("cli_hold_rtdir");
    let u = url(&base);
    let open = base.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    let link = base.join("link");
    let private = base.join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::symlink(&private, &link).unwrap();
    for (dir, why) in [(&open, "open to other users"), (&link, "not a folder")] {
        let out = on_key(dir, "acquire", "k", &u, &[]).await;
        assert_eq!(out.status.code(), Some(78), "{out:?}");
        assert!(stderr(&out).contains(why), "{out:?}");
    }
    let mode = std::fs::metadata(&open).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755, "not changed behind the user's back");
    // Relative: resolved against the current folder, so the handle works from anywhere.
    let out = lh(
        std::path::Path::new("rel-rt"),
        &["acquire", "--key", "k", "--url", &u],
    )
    .current_dir(&base)
    .output()
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let handle = exports(&out)["LEASEHOLD_HANDLE"].clone();
    assert!(
        handle.starts_with(base.join("rel-rt").to_str().unwrap()),
        "{handle}"
    );
    let rel = output(&base, &["release", "--handle", &handle]).await;
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
}

#[tokio::test]
async fn a_signal_while_acquiring_exits_128_plus_n() {
    let rt = folder("cli_hold_sig");
    let u = url(&rt);
    let first = exports(&on_key(&rt, "acquire", "s", &u, &[]).await);
    // acquire: its holder is told to stop while waiting.
    let waiting = lh(
        &rt,
        &["acquire", "--key", "s", "--url", &u, "--wait", "30s"],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let holder = eventually_child_of(waiting.id().unwrap()).await;
    eventually(
        "the holder handles SIGTERM",
        Duration::from_secs(10),
        || catches(holder, 15),
    )
    .await;
    std::process::Command::new("kill")
        .arg(holder.to_string())
        .status()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), waiting.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(143), "{out:?}");
    assert!(stdout(&out).is_empty());
    // run: SIGINT while waiting.
    let waiting = lh(
        &rt,
        &[
            "run", "--key", "s", "--url", &u, "--wait", "30s", "--", "true",
        ],
    )
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let pid = waiting.id().unwrap();
    eventually("run handles SIGINT", Duration::from_secs(10), || {
        catches(pid, 2)
    })
    .await;
    std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()
        .unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), waiting.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    // Neither took the lock on its way out.
    let rel = output(&rt, &["release", "--handle", &first["LEASEHOLD_HANDLE"]]).await;
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
    let st = on_key(&rt, "status", "s", &u, &[]).await;
    assert_eq!(st.status.code(), Some(1), "{st:?}");
}

#[tokio::test]
async fn acquire_sweeps_records_of_ended_holds_older_than_a_day() {
    let rt = folder("cli_hold_sweep");
    let u = url(&rt);
    let record = |name: &str, key: &str| {
        let p = rt.join(name);
        std::fs::write(
            &p,
            format!(
                "LEASEHOLD_STATE='lost'\nLEASEHOLD_KEY='{key}'\nLEASEHOLD_LOCATION='{u}'\nLEASEHOLD_HOLDER_PID='0'\n"
            ),
        )
        .unwrap();
        p
    };
    let old = record("1.state", "sw");
    let old_other_key = record("2.state", "other");
    let recent = record("3.state", "sw");
    for p in [&old, &old_other_key] {
        let st = std::process::Command::new("touch")
            .args(["-d", "2 days ago"])
            .arg(p)
            .status()
            .unwrap();
        assert!(st.success());
    }
    let out = on_key(&rt, "acquire", "sw", &u, &[]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(!old.exists(), "a day-old lost record of the same lock goes");
    assert!(recent.exists(), "a recent one waits for its release");
    assert!(
        old_other_key.exists(),
        "another lock's record is not ours to sweep"
    );
    let rel = output(&rt, &["release", "--handle", recent.to_str().unwrap()]).await;
    assert_eq!(rel.status.code(), Some(79), "{rel:?}");
    let rel = output(&rt, &["release", "--key", "sw"]).await;
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
}
