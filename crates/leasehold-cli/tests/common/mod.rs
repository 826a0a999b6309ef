//! Helpers shared by the CLI's end-to-end tests: run the binary with a private runtime folder,
//! read its `export` lines, wait for holders.

#![allow(dead_code)] // each test file uses its own subset

pub(crate) mod election;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use leasehold_test_support::services::TempFolder;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_leasehold");

/// A private folder (mode 0700, as leasehold requires of a runtime folder) for one test
/// (runtime folder, lock files), removed when dropped.
pub(crate) fn folder(test: &str) -> TempFolder {
    TempFolder::new(test)
}

/// `leasehold ARGS` with its runtime folder in `rt`.
pub(crate) fn lh(rt: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("LEASEHOLD_RUNTIME_DIR", rt)
        .env_remove("LEASEHOLD_HANDLE")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    c
}

pub(crate) async fn output(rt: &Path, args: &[&str]) -> Output {
    tokio::time::timeout(Duration::from_secs(60), lh(rt, args).output())
        .await
        .expect("leasehold finishes within a minute")
        .expect("leasehold runs")
}

/// `leasehold VERB --key KEY --url URL EXTRA...`.
pub(crate) async fn on_key(rt: &Path, verb: &str, key: &str, url: &str, extra: &[&str]) -> Output {
    let mut args = vec![verb, "--key", key, "--url", url];
    args.extend_from_slice(extra);
    output(rt, &args).await
}

/// `leasehold run --key KEY --url URL OPTS... -- true`.
pub(crate) async fn run_true(rt: &Path, key: &str, url: &str, opts: &[&str]) -> Output {
    let mut extra = opts.to_vec();
    extra.extend_from_slice(&["--", "true"]);
    on_key(rt, "run", key, url, &extra).await
}

/// While someone else (`who`) holds `key`, `run --no-wait` fails with 75; `run --wait 20s`
/// runs once they let go.
pub(crate) async fn busy_then_runs_after(rt: &Path, key: &str, url: &str, who: &str) {
    let out = run_true(rt, key, url, &["--no-wait"]).await;
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let out = run_true(rt, key, url, &["--wait", "20s"]).await;
    assert_eq!(out.status.code(), Some(0), "after {who}: {out:?}");
}

/// Polls `leasehold status` every 50 ms until it says held (exit 0); that output. Fails with
/// `what` after `limit`.
pub(crate) async fn until_held(
    rt: &Path,
    key: &str,
    url: &str,
    limit: Duration,
    what: &str,
) -> Output {
    let t0 = Instant::now();
    loop {
        let st = on_key(rt, "status", key, url, &[]).await;
        if st.status.code() == Some(0) {
            return st;
        }
        assert!(t0.elapsed() < limit, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The holder process's pid from `acquire`'s exports.
pub(crate) fn holder_pid(ex: &BTreeMap<String, String>) -> u32 {
    ex["LEASEHOLD_HOLDER_PID"].parse().expect("a pid")
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `export NAME='value'` (and `unset NAME`) lines of `acquire`, as a map.
pub(crate) fn exports(o: &Output) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for line in stdout(o).lines() {
        if let Some(rest) = line.strip_prefix("export ") {
            let (k, v) = rest.split_once('=').expect("NAME=value");
            let v = v
                .strip_prefix('\'')
                .and_then(|v| v.strip_suffix('\''))
                .expect("single-quoted")
                .replace(r"'\''", "'");
            m.insert(k.to_owned(), v);
        } else {
            assert!(line.starts_with("unset "), "unexpected line {line:?}");
        }
    }
    m
}

/// Whether process `pid` still runs (zombies count as gone).
pub(crate) fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(
            stat.rsplit_once(')')
                .map(|(_, r)| r.trim_start().chars().next()),
            Some(Some('Z' | 'X'))
        ),
        Err(_) => false,
    }
}

/// Whether process `pid` has a handler for signal number `signal` (its `SigCgt` mask in
/// `/proc`): a process signalled before it installed one dies by the default action instead.
pub(crate) fn catches(pid: u32, signal: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (signal - 1)) != 0)
}

/// Polls `cond` every 20 ms until it holds, failing after `limit`.
pub(crate) async fn eventually(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A spawned `leasehold run` whose command prints one line once it runs.
pub(crate) struct Running {
    pub(crate) child: Child,
    pub(crate) first_line: String,
    reader: BufReader<tokio::process::ChildStdout>,
}

impl Running {
    /// Spawns `leasehold ARGS` with stdout and stderr piped, and waits for its first line.
    pub(crate) async fn start(rt: &Path, args: &[&str]) -> Self {
        let mut child = lh(rt, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn leasehold");
        let mut reader = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first_line = String::new();
        tokio::time::timeout(Duration::from_secs(20), reader.read_line(&mut first_line))
            .await
            .expect("the command starts within 20 s")
            .expect("read stdout");
        assert!(!first_line.is_empty(), "leasehold ended before its command");
        Self {
            child,
            first_line: first_line.trim().to_owned(),
            reader,
        }
    }

    /// Waits (at most `limit`) for the end: exit code, the rest of stdout, stderr.
    pub(crate) async fn finish(mut self, limit: Duration) -> (Option<i32>, String, String) {
        let mut err = self.child.stderr.take().expect("stderr");
        let fut = async {
            let mut out = String::new();
            let mut e = String::new();
            let _ = self.reader.read_to_string(&mut out).await;
            let _ = err.read_to_string(&mut e).await;
            let status = self.child.wait().await.expect("wait");
            (status.code(), out, e)
        };
        tokio::time::timeout(limit, fut)
            .await
            .expect("leasehold ends in time")
    }
}

/// The `redlock://` URL of the Redlock nodes' `redis://` URLs.
pub(crate) fn redlock_url(nodes: &[String]) -> String {
    let hosts: Vec<String> = nodes
        .iter()
        .map(|u| {
            u.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    format!("redlock://{}", hosts.join(","))
}

/// Finds a tool the services script installs (psql may live outside PATH).
pub(crate) fn tool(name: &str) -> PathBuf {
    if let Some(paths) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&paths) {
            let p = d.join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    if let Ok(versions) = std::fs::read_dir("/usr/lib/postgresql") {
        for v in versions.flatten() {
            let p = v.path().join("bin").join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!("{name} not found (scripts/services install provides it)");
}

/// Runs a tool to completion; its stdout (fails the test on a non-zero exit).
pub(crate) fn sh_tool(name: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(tool(name))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run tool");
    assert!(
        out.status.success(),
        "{name} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
