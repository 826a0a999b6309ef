//! The CLI end to end on each server backend (Redis, Redlock, PostgreSQL, etcd), against the
//! real servers of `scripts/services up`:
//!
//! - two `leasehold run` on one key: the second fails (`--no-wait`, 75), times out (124) or
//!   waits and runs after the first, with a higher fencing token where the backend mints them;
//! - a lease lost mid-run (the Redis key deleted, the Redlock key taken on every node,
//!   `pg_terminate_backend` of the lock session, the etcd lease revoked) terminates the command
//!   and exits 79;
//! - `acquire` / `status` / `release` round trips, and a lost lease reported by `release`;
//! - the key mapping of docs/guide.md: the same lock taken by hand with `redis-cli`, `psql` and
//!   `etcdctl`, with the exact commands the guide shows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};

/// One backend under test.
struct Case {
    url: String,
    /// `--ttl` for every acquisition.
    ttl: &'static str,
    /// Leases carry a fencing token.
    mints: bool,
    /// `status` shows the holder's fencing token.
    status_token: bool,
}

/// Makes the current holder of `key` lose its lease, for real.
type Fault = Box<dyn Fn(&str) + Send + Sync>;

// ----- the scenarios, the same for every backend -----

async fn two_runs(rt: &Path, case: &Case, key: &str) {
    let u = case.url.as_str();
    // The first holds for 8 s: the three runs below must all start while it holds, and on two
    // loaded cores each start of a debug build (and its connection) has taken over a second.
    let started = Instant::now();
    let first = Running::start(
        rt,
        &[
            "run",
            "--key",
            key,
            "--url",
            u,
            "--ttl",
            case.ttl,
            "--",
            "sh",
            "-c",
            "echo \"token=$LEASEHOLD_FENCING_TOKEN\"; sleep 8",
        ],
    )
    .await;
    let t1 = first.first_line.strip_prefix("token=").unwrap().to_owned();
    assert_eq!(!t1.is_empty(), case.mints, "token: {t1:?}");

    let t = Instant::now();
    let out = run_true(rt, key, u, &["--no-wait"]).await;
    assert_eq!(out.status.code(), Some(75), "contention: {out:?}");
    // Well under the first run's 8 s: a debug build's start has taken over a second here.
    assert!(t.elapsed() < Duration::from_secs(5), "--no-wait waited");
    assert!(stderr(&out).contains("held by someone else"));

    let out = run_true(rt, key, u, &["--wait", "300ms"]).await;
    assert_eq!(out.status.code(), Some(124), "timeout: {out:?}");

    let out = output(
        rt,
        &[
            "run",
            "--key",
            key,
            "--url",
            u,
            "--ttl",
            case.ttl,
            "--wait",
            "20s",
            "--",
            "sh",
            "-c",
            "echo \"token=$LEASEHOLD_FENCING_TOKEN\"",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(stderr(&out).contains("waiting up to 20s"), "{out:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(8),
        "it ran before the first let go"
    );
    let t2 = stdout(&out)
        .trim()
        .strip_prefix("token=")
        .unwrap()
        .to_owned();
    if case.mints {
        assert!(
            t2.parse::<u64>().unwrap() > t1.parse::<u64>().unwrap(),
            "tokens go up: {t1} then {t2}"
        );
    }
    let (code, _, err) = first.finish(Duration::from_secs(10)).await;
    assert_eq!(code, Some(0), "{err}");
}

async fn lost_mid_run(rt: &Path, case: &Case, key: &str, lose: &Fault) {
    let run = Running::start(
        rt,
        &[
            "run",
            "--key",
            key,
            "--url",
            &case.url,
            "--ttl",
            case.ttl,
            "--grace",
            "2s",
            "--",
            "sh",
            "-c",
            "echo ready; trap 'echo got TERM; exit 0' TERM; while true; do sleep 0.1; done",
        ],
    )
    .await;
    assert_eq!(run.first_line, "ready");
    lose(key);
    let t = Instant::now();
    let (code, out, err) = run.finish(Duration::from_secs(20)).await;
    assert_eq!(code, Some(79), "lease-lost code: {out} {err}");
    assert_eq!(out.trim(), "got TERM", "the command got SIGTERM");
    assert!(err.contains("lost"), "{err}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "noticed in {:?}",
        t.elapsed()
    );
}

async fn acquire_status_release(rt: &Path, case: &Case, key: &str) {
    let u = case.url.as_str();
    let out = on_key(rt, "acquire", key, u, &["--ttl", case.ttl]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ex = exports(&out);
    assert_eq!(ex["LEASEHOLD_KEY"], key);
    assert_eq!(
        ex.contains_key("LEASEHOLD_FENCING_TOKEN"),
        case.mints,
        "{ex:?}"
    );
    let pid = holder_pid(&ex);

    let st = on_key(rt, "status", key, u, &["--json"]).await;
    assert_eq!(st.status.code(), Some(0), "held: {st:?}");
    let json = stdout(&st);
    assert!(json.contains("\"held\":true"), "{json}");
    if case.status_token {
        let token = &ex["LEASEHOLD_FENCING_TOKEN"];
        assert!(
            json.contains(&format!("\"fencing_token\":{token}")),
            "{json}"
        );
    }
    let busy = on_key(rt, "acquire", key, u, &["--no-wait"]).await;
    assert_eq!(busy.status.code(), Some(75), "{busy:?}");
    // The holder keeps the lease past several TTLs.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(alive(pid));
    let st = on_key(rt, "status", key, u, &[]).await;
    assert_eq!(st.status.code(), Some(0), "still held: {st:?}");

    let rel = on_key(rt, "release", key, u, &[]).await;
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
    assert!(!alive(pid));
    let st = on_key(rt, "status", key, u, &[]).await;
    assert_eq!(st.status.code(), Some(1), "free: {st:?}");
    assert!(stdout(&st).contains("is free"));
}

async fn lost_while_held(rt: &Path, case: &Case, key: &str, lose: &Fault) {
    let u = case.url.as_str();
    let out = on_key(rt, "acquire", key, u, &["--ttl", case.ttl]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ex = exports(&out);
    let pid = holder_pid(&ex);
    lose(key);
    eventually("the holder notices", Duration::from_secs(15), || {
        !alive(pid)
    })
    .await;
    let rel = output(rt, &["release", "--handle", &ex["LEASEHOLD_HANDLE"]]).await;
    assert_eq!(rel.status.code(), Some(79), "{rel:?}");
    assert!(stderr(&rel).contains("was lost"), "{rel:?}");
}

/// Everything above, one key each.
async fn scenarios(test: &str, case: Case, lose: Fault) {
    let rt = folder(test);
    let k = |s: &str| format!("{}/{s}", unique_prefix(test));
    two_runs(&rt, &case, &k("two")).await;
    lost_mid_run(&rt, &case, &k("lost-run"), &lose).await;
    acquire_status_release(&rt, &case, &k("hold")).await;
    lost_while_held(&rt, &case, &k("lost-hold"), &lose).await;
}

/// A fresh key for a test that takes the lock by hand too.
fn hand_key() -> String {
    format!("{}/nightly", unique_prefix("hand"))
}

fn host_port(url: &str) -> (String, String) {
    let hp = url
        .split_once("://")
        .map_or(url, |(_, r)| r)
        .trim_end_matches('/');
    let (h, p) = hp.rsplit_once(':').unwrap();
    (h.to_owned(), p.to_owned())
}

fn redis_cli(url: &str, args: &[&str]) -> String {
    let (h, p) = host_port(url);
    let mut all = vec!["-h", h.as_str(), "-p", p.as_str()];
    all.extend_from_slice(args);
    sh_tool("redis-cli", &all).trim().to_owned()
}

// ----- Redis -----

#[tokio::test]
async fn redis_end_to_end() {
    let redis = require_service!(Service::Redis);
    let url = redis.url().to_owned();
    let node = url.clone();
    let lose: Fault = Box::new(move |key| {
        // The documented key: leasehold:{<key>}.
        assert_eq!(
            redis_cli(&node, &["DEL", &format!("leasehold:{{{key}}}")]),
            "1"
        );
    });
    let case = Case {
        url,
        ttl: "3s",
        mints: true,
        status_token: true,
    };
    scenarios("cli_redis", case, lose).await;
}

#[tokio::test]
async fn redis_by_hand_as_the_guide_shows() {
    let redis = require_service!(Service::Redis);
    let url = redis.url();
    let rt = folder("cli_redis_hand");
    let key = hand_key();
    let name = format!("leasehold:{{{key}}}");
    // Take it by hand: leasehold sees it held.
    assert_eq!(
        redis_cli(url, &["SET", &name, "by-hand", "NX", "PX", "30000"]),
        "OK"
    );
    let out = run_true(&rt, &key, url, &["--no-wait"]).await;
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let st = on_key(&rt, "status", &key, url, &[]).await;
    assert!(stdout(&st).contains("owner: by-hand"), "{st:?}");
    // Give it back with the compare-and-delete of the guide.
    let script =
        "if redis.call('GET',KEYS[1])==ARGV[1] then return redis.call('DEL',KEYS[1]) end return 0";
    assert_eq!(
        redis_cli(url, &["EVAL", script, "1", &name, "by-hand"]),
        "1"
    );
    // While leasehold holds it, SET NX by hand fails.
    let out = on_key(&rt, "acquire", &key, url, &[]).await;
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        redis_cli(url, &["SET", &name, "by-hand", "NX", "PX", "30000"]),
        ""
    );
    let token = exports(&out)["LEASEHOLD_FENCING_TOKEN"].clone();
    assert_eq!(redis_cli(url, &["GET", &format!("{name}:fence")]), token);
    let rel = output(&rt, &["release", "--key", &key]).await;
    assert_eq!(rel.status.code(), Some(0));
    assert_eq!(redis_cli(url, &["EXISTS", &name]), "0");
    redis_cli(url, &["DEL", &format!("{name}:fence")]);
}

// ----- Redlock -----

#[tokio::test]
async fn redlock_end_to_end() {
    let nodes = require_service!(Service::Redlock).urls().to_vec();
    let url = redlock_url(&nodes);
    let lose: Fault = Box::new(move |key| {
        // Another client takes the key on every node (deleting it is not enough: Redlock's
        // extend sets it again on a node that lost it).
        let name = format!("leasehold:{{{key}}}");
        for n in &nodes {
            assert_eq!(
                redis_cli(n, &["SET", &name, "intruder", "PX", "20000"]),
                "OK"
            );
        }
    });
    let case = Case {
        url,
        ttl: "3s",
        mints: false,
        status_token: false,
    };
    scenarios("cli_redlock", case, lose).await;
}

#[tokio::test]
async fn redlock_by_hand_on_a_majority() {
    let nodes = require_service!(Service::Redlock).urls().to_vec();
    let url = redlock_url(&nodes);
    let rt = folder("cli_redlock_hand");
    let key = hand_key();
    let name = format!("leasehold:{{{key}}}");
    // SET NX on 3 of the 5 nodes is a majority: leasehold cannot take it.
    for n in &nodes[..3] {
        assert_eq!(
            redis_cli(n, &["SET", &name, "by-hand", "NX", "PX", "30000"]),
            "OK"
        );
    }
    let out = run_true(&rt, &key, &url, &["--no-wait"]).await;
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    for n in &nodes {
        redis_cli(n, &["DEL", &name]);
    }
    let out = run_true(&rt, &key, &url, &["--no-wait"]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

// ----- PostgreSQL -----

fn psql(url: &str, args: &[&str]) -> String {
    let mut all = vec![url, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"];
    all.extend_from_slice(args);
    sh_tool("psql", &all).trim().to_owned()
}

/// The guide's query: end the session holding leasehold's lock on `key`.
fn pg_terminate_sql(key: &str) -> String {
    let id = leasehold::postgres::advisory_key(key);
    format!(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
         AND objsubid = 1 AND granted AND ((classid::bigint << 32) | objid::bigint) = {id}"
    )
}

#[tokio::test]
async fn postgres_end_to_end() {
    let pg = require_service!(Service::Postgres);
    let url = pg.url().to_owned();
    let admin = url.clone();
    let lose: Fault = Box::new(move |key| {
        assert_eq!(psql(&admin, &["-c", &pg_terminate_sql(key)]), "t");
    });
    let case = Case {
        url,
        ttl: "3s",
        mints: true,
        status_token: false,
    };
    scenarios("cli_postgres", case, lose).await;
}

#[tokio::test]
async fn postgres_by_hand_as_the_guide_shows() {
    let pg = require_service!(Service::Postgres);
    let url = pg.url().to_owned();
    let rt = folder("cli_pg_hand");
    let key = hand_key();
    // The guide's leasehold_key function (as a temporary function: the database is shared).
    let function = format!(
        "CREATE FUNCTION pg_temp.leasehold_key(name text) RETURNS bigint LANGUAGE sql IMMUTABLE STRICT AS $lh$ {} $lh$",
        leasehold::postgres::KEY_SQL.replace("$1", "name")
    );
    let computed = psql(
        &url,
        &[
            "-c",
            &function,
            "-c",
            &format!("SELECT pg_temp.leasehold_key('{key}')"),
        ],
    );
    assert_eq!(
        computed,
        leasehold::postgres::advisory_key(&key).to_string()
    );

    // psql holds it for 10 s: leasehold sees it held (each `status` and `run` a process
    // start of a debug build, over a second each on a loaded machine), then takes it after.
    let lock = format!("SELECT pg_advisory_lock(pg_temp.leasehold_key('{key}'))");
    let mut holder = tokio::process::Command::new(tool("psql"))
        .args([
            &url,
            "-X",
            "-At",
            "-c",
            &function,
            "-c",
            &lock,
            "-c",
            "SELECT pg_sleep(10)",
        ])
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let st = until_held(&rt, &key, &url, Duration::from_secs(6), "psql never locked").await;
    assert!(stdout(&st).contains("held by backend pid"), "{st:?}");
    busy_then_runs_after(&rt, &key, &url, "psql").await;
    assert!(holder.wait().await.unwrap().success());

    // And the other way round: while leasehold holds it, psql's try fails.
    let out = on_key(&rt, "acquire", &key, &url, &[]).await;
    assert_eq!(out.status.code(), Some(0));
    let try_lock = format!("SELECT pg_try_advisory_lock(pg_temp.leasehold_key('{key}'))");
    assert_eq!(psql(&url, &["-c", &function, "-c", &try_lock]), "f");
    let rel = output(&rt, &["release", "--key", &key]).await;
    assert_eq!(rel.status.code(), Some(0));
    assert_eq!(psql(&url, &["-c", &function, "-c", &try_lock]), "t");
}

// ----- etcd -----

fn etcdctl(endpoint: &str, args: &[&str]) -> String {
    let mut all = vec!["--endpoints", endpoint];
    all.extend_from_slice(args);
    let out = std::process::Command::new(tool("etcdctl"))
        .args(&all)
        .env("ETCDCTL_API", "3")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "etcdctl {args:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Lock `key` as it appears in etcd names, as the guide says: `%` written `%25`, `/` `%2F`.
fn etcd_name(key: &str) -> String {
    key.replace('%', "%25").replace('/', "%2F")
}

/// The guide's `etcdctl get`: the first key queued on lock `key` (its holder), as fields.
fn etcd_first_waiter(endpoint: &str, key: &str) -> String {
    etcdctl(
        endpoint,
        &[
            "get",
            "--prefix",
            &format!("leasehold/{}/", etcd_name(key)),
            "--sort-by=CREATE",
            "--order=ASCEND",
            "--limit=1",
            "-w",
            "fields",
        ],
    )
}

/// `etcdctl lock leasehold/<key> CMD...`, spawned, its stdout going to `out`.
fn etcdctl_lock(
    endpoint: &str,
    key: &str,
    cmd: &[&str],
    out: std::process::Stdio,
) -> tokio::process::Child {
    tokio::process::Command::new(tool("etcdctl"))
        .args([
            "--endpoints",
            endpoint,
            "lock",
            &format!("leasehold/{}", etcd_name(key)),
        ])
        .args(cmd)
        .env("ETCDCTL_API", "3")
        .stdout(out)
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The lease of the key holding lock `key`, as the guide shows how to find it.
fn etcd_holder_lease(endpoint: &str, key: &str) -> String {
    let fields = etcd_first_waiter(endpoint, key);
    let lease: i64 = fields
        .lines()
        .find_map(|l| l.strip_prefix("\"Lease\" : "))
        .unwrap_or_else(|| panic!("no holder key: {fields}"))
        .trim()
        .parse()
        .unwrap();
    format!("{lease:x}")
}

#[tokio::test]
async fn etcd_end_to_end() {
    let etcd = require_service!(Service::EtcdCluster);
    let endpoints = etcd.urls().join(",");
    let first = etcd.urls()[0].clone();
    let lose: Fault = Box::new(move |key| {
        let lease = etcd_holder_lease(&first, key);
        let said = etcdctl(&first, &["lease", "revoke", &lease]);
        assert!(said.contains("revoked"), "{said}");
    });
    let case = Case {
        url: format!("etcd://{endpoints}"),
        ttl: "3s",
        mints: true,
        status_token: true,
    };
    scenarios("cli_etcd", case, lose).await;
}

/// `run --wait` that runs out exits 124 only after deleting its queue key: a waiter key left
/// behind (on a session lease nobody revokes once the process is gone) would take the lock
/// when its holder releases and keep it until the lease expires.
#[tokio::test]
async fn etcd_a_wait_that_runs_out_leaves_no_waiter_behind() {
    let etcd = require_service!(Service::Etcd);
    let endpoint = etcd.url().to_owned();
    let url = format!("etcd://{endpoint}");
    let rt = folder("cli_etcd_wait_cleanup");
    let key = format!("{}/k", unique_prefix("wait-cleanup"));
    let out = on_key(&rt, "acquire", &key, &url, &[]).await;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let ex = exports(&out);
    let out = run_true(&rt, &key, &url, &["--wait", "300ms"]).await;
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    let queued = etcdctl(
        &endpoint,
        &[
            "get",
            "--prefix",
            &format!("leasehold/{}/", etcd_name(&key)),
            "--keys-only",
        ],
    );
    assert_eq!(
        queued.lines().filter(|l| !l.is_empty()).count(),
        1,
        "{queued}"
    );
    let rel = output(&rt, &["release", "--handle", &ex["LEASEHOLD_HANDLE"]]).await;
    assert_eq!(rel.status.code(), Some(0), "{rel:?}");
}

#[tokio::test]
async fn etcd_by_hand_as_the_guide_shows() {
    let etcd = require_service!(Service::Etcd);
    let endpoint = etcd.url().to_owned();
    let url = format!("etcd://{endpoint}");
    let rt = folder("cli_etcd_hand");
    let key = hand_key();
    // `etcdctl lock leasehold/<key> CMD` holds our lock while CMD runs.
    let mut holder = etcdctl_lock(
        &endpoint,
        &key,
        &["sleep", "10"],
        std::process::Stdio::null(),
    );
    until_held(
        &rt,
        &key,
        &url,
        Duration::from_secs(6),
        "etcdctl never locked",
    )
    .await;
    busy_then_runs_after(&rt, &key, &url, "etcdctl").await;
    assert!(holder.wait().await.unwrap().success());

    // While leasehold holds it, the guide's `get` shows our key first, and `etcdctl lock`
    // queues behind us (it is still waiting when we release).
    let out = on_key(&rt, "acquire", &key, &url, &[]).await;
    assert_eq!(out.status.code(), Some(0));
    let ex = exports(&out);
    let shown = etcd_first_waiter(&endpoint, key.as_str());
    assert!(
        shown.contains(&format!(
            "\"CreateRevision\" : {}",
            ex["LEASEHOLD_FENCING_TOKEN"]
        )),
        "{shown}"
    );
    let mut queued = etcdctl_lock(
        &endpoint,
        &key,
        &["echo", "mine"],
        std::process::Stdio::piped(),
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        queued.try_wait().unwrap().is_none(),
        "etcdctl lock waits for us"
    );
    let rel = output(&rt, &["release", "--key", &key]).await;
    assert_eq!(rel.status.code(), Some(0));
    let done = tokio::time::timeout(Duration::from_secs(10), queued.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&done.stdout).trim(), "mine");
}
