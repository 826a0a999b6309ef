//! Liveness follows the TTL: after a SIGKILL of an `acquire` holder started with `--ttl 3s`,
//! another client takes the lock within about the TTL — not much later (etcd once kept it for
//! its 10 s session lease), and not much earlier (the TTL is honoured) — on etcd and Redis;
//! `status` states the bound.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{alive, eventually, exports, holder_pid, on_key, run_true, stdout};
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};

const TTL: Duration = Duration::from_secs(3);

/// Acquires `key` with `--ttl 3s` in a holder process, lets it renew a while, SIGKILLs it, and
/// returns how long until `run --no-wait` gets the lock.
async fn freed_after_sigkill(rt: &Path, key: &str, url: &str) -> Duration {
    let out = on_key(rt, "acquire", key, url, &["--ttl", "3s"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let pid = holder_pid(&exports(&out));
    // Past a renewal or two: the bound must hold for a lease that was renewed.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        run_true(rt, key, url, &["--no-wait"]).await.status.code(),
        Some(75)
    );
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    let killed = Instant::now();
    eventually("the holder dies", Duration::from_secs(5), || !alive(pid)).await;
    loop {
        let out = run_true(rt, key, url, &["--no-wait"]).await;
        match out.status.code() {
            Some(0) => return killed.elapsed(),
            Some(75) => {}
            other => panic!("run --no-wait: {other:?} {out:?}"),
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "still held 30 s after its holder was killed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The lock came back within TTL + generous slack (two loaded cores, a process spawn per
/// probe), and not within half the TTL (the lock really lived on its TTL).
fn assert_within_the_ttl(backend: &str, freed: Duration) {
    assert!(
        freed <= TTL + Duration::from_millis(3_500),
        "{backend}: freed {freed:?} after SIGKILL of a holder with --ttl 3s"
    );
    assert!(
        freed >= TTL / 2,
        "{backend}: freed after only {freed:?}: the TTL was not honoured"
    );
}

/// `status --json --ttl 3s` states the crash-release bound.
async fn status_states_the_bound(rt: &Path, url: &str, want_ms: &str) {
    let out = on_key(rt, "status", "free-key", url, &["--json", "--ttl", "3s"]).await;
    let json = stdout(&out);
    assert!(
        json.contains(&format!("\"crash_release_ms\":{want_ms}")),
        "{json}"
    );
    let out = on_key(rt, "status", "free-key", url, &["--ttl", "3s"]).await;
    assert!(stdout(&out).contains("crash release (ttl 3s): "), "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_frees_a_killed_holders_lock_within_its_ttl() {
    let etcd = require_service!(Service::Etcd);
    let rt = common::folder("crash-etcd");
    let url = format!(
        "etcd://{}?prefix={}/",
        etcd.urls().join(","),
        unique_prefix("crash")
    );
    status_states_the_bound(&rt, &url, "3000").await;
    let freed = freed_after_sigkill(&rt, "job", &url).await;
    assert_within_the_ttl("etcd", freed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_frees_a_killed_holders_lock_within_its_ttl() {
    let redis = require_service!(Service::Redis);
    let rt = common::folder("crash-redis");
    let url = redis.url().to_owned();
    status_states_the_bound(&rt, &url, "3000").await;
    let freed = freed_after_sigkill(&rt, &unique_prefix("crash-job"), &url).await;
    assert_within_the_ttl("redis", freed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_frees_a_killed_holders_lock_with_its_process() {
    let pg = require_service!(Service::Postgres);
    let rt = common::folder("crash-pg");
    status_states_the_bound(&rt, pg.url(), "null").await;
}
