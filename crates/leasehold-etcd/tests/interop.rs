//! Interoperation with `etcdctl lock`, the key layout, leases revoked from outside, and
//! dropped waiters, on the single etcd member.

mod common;

use std::process::Stdio;
use std::time::Duration;

use etcd_client::GetOptions;
use leasehold_core::ErrorKind;
use leasehold_etcd::LeaseMode;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Endpoints, Service};
use tokio::process::{Child, Command};
use tokio::time::{Instant, sleep, timeout};

/// Starts `etcdctl lock NAME CMD…` (ETCDCTL_API=3); killed (by its pid) when dropped.
fn etcdctl_lock(endpoints: &Endpoints, name: &str, cmd: &[&str]) -> Child {
    let spawned = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(endpoints.raw())
        .arg("lock")
        .arg(name)
        .args(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    match spawned {
        Ok(c) => c,
        Err(e) => panic!("cannot run etcdctl: {e}"),
    }
}

/// Waits until exactly `n` keys live under `range` (at most 10 s).
async fn wait_keys(client: &etcd_client::Client, range: &str, n: usize) -> usize {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let got = match common::count(client, range).await {
            Ok(c) => c,
            Err(e) => panic!("count {range}: {e}"),
        };
        if got == n || Instant::now() >= give_up {
            return got;
        }
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lock_blocks_our_acquire() {
    let ep = require_service!(Service::Etcd);
    let prefix = common::prefix("etcdctl-holds");
    let client = common::raw(&ep).await;
    let l = common::locker(common::backend(&ep, &prefix, LeaseMode::Session).await);
    let name = format!("{prefix}job");
    // etcdctl holds the lock for 3 s, then unlocks and exits.
    let mut child = etcdctl_lock(&ep, &name, &["sleep", "3"]);
    assert_eq!(
        wait_keys(&client, &format!("{name}/"), 1).await,
        1,
        "etcdctl never locked"
    );

    assert!(
        l.try_acquire("job").await.unwrap().is_none(),
        "try_acquire ignored etcdctl's lock"
    );
    let holder = l
        .inspect("job")
        .await
        .unwrap()
        .expect("etcdctl is the holder");
    assert_eq!(holder.owner, None, "etcdctl writes an empty value");
    let err = l
        .acquire("job", Duration::from_millis(500))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);

    let t0 = Instant::now();
    let lease = l.acquire("job", Duration::from_secs(15)).await.unwrap();
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(500),
        "granted after only {waited:?}"
    );
    let status = timeout(Duration::from_secs(5), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "etcdctl failed: {status}");
    assert!(lease.fencing_token().is_some());
    assert!(lease.release().await.unwrap());
    assert_eq!(wait_keys(&client, &format!("{name}/"), 0).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_lock_blocks_etcdctl_lock() {
    let ep = require_service!(Service::Etcd);
    let prefix = common::prefix("we-hold");
    let client = common::raw(&ep).await;
    let l = common::locker(common::backend(&ep, &prefix, LeaseMode::Session).await);
    let name = format!("{prefix}job");
    let lease = l.try_acquire("job").await.unwrap().expect("free lock");

    let mut child = etcdctl_lock(&ep, &name, &["echo", "etcdctl-got-it"]);
    // etcdctl queues behind us (its key appears) and stays blocked.
    assert_eq!(
        wait_keys(&client, &format!("{name}/"), 2).await,
        2,
        "etcdctl did not queue"
    );
    let blocked = timeout(Duration::from_secs(2), child.wait()).await;
    assert!(
        blocked.is_err(),
        "etcdctl lock returned while we held the lock: {blocked:?}"
    );

    assert!(lease.release().await.unwrap());
    let out = match timeout(Duration::from_secs(10), child.wait_with_output()).await {
        Ok(out) => out.unwrap(),
        Err(_) => panic!("etcdctl still blocked 10 s after our release"),
    };
    assert!(
        out.status.success(),
        "etcdctl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("etcdctl-got-it"), "{stdout}");
    assert_eq!(wait_keys(&client, &format!("{name}/"), 0).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_layout_matches_the_concurrency_recipe() {
    let ep = require_service!(Service::Etcd);
    let prefix = common::prefix("layout");
    let client = common::raw(&ep).await;
    let backend = common::backend(&ep, &prefix, LeaseMode::Session).await;
    let session = backend.session_lease_id().await.expect("a session lease");
    let l = common::locker(backend);
    let lease = l.try_acquire("a/b").await.unwrap().unwrap();
    let resp = client
        .kv_client()
        .get(
            format!("{prefix}a%2Fb/"),
            Some(GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    assert_eq!(resp.kvs().len(), 1);
    let kv = &resp.kvs()[0];
    assert_eq!(kv.key_str().unwrap(), format!("{prefix}a%2Fb/{session:x}"));
    assert_eq!(kv.value(), lease.owner().as_str().as_bytes());
    assert_eq!(kv.lease(), session);
    assert_eq!(
        lease.fencing_token().map(|t| t.get()),
        u64::try_from(kv.create_revision()).ok()
    );
    let again = l.try_acquire("a/b").await.unwrap();
    assert!(
        again.is_none(),
        "two local tasks held one key through the shared lease"
    );
    assert!(lease.release().await.unwrap());
    let next = l.try_acquire("a/b").await.unwrap().unwrap();
    assert!(next.fencing_token() > lease.fencing_token());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_revoked_from_outside_fires_lost_and_backend_recovers() {
    let ep = require_service!(Service::Etcd);
    let prefix = common::prefix("revoked");
    let client = common::raw(&ep).await;
    let l = common::locker(common::backend(&ep, &prefix, LeaseMode::Session).await);
    let a = l.try_acquire("job").await.unwrap().unwrap();
    let b = l.try_acquire("other").await.unwrap().unwrap();
    let id = common::lease_of(&client, &prefix, &a)
        .await
        .unwrap()
        .unwrap();
    let revoked = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args([
            "--endpoints",
            ep.raw(),
            "lease",
            "revoke",
            &format!("{id:x}"),
        ])
        .output()
        .await
        .unwrap();
    assert!(
        revoked.status.success(),
        "{}",
        String::from_utf8_lossy(&revoked.stderr)
    );
    let t0 = Instant::now();
    // Keep-alives run every session_ttl / 3 at most (here 5 s / 3); the signal must follow.
    let reason = timeout(Duration::from_secs(3), a.lost().wait())
        .await
        .expect("lost signal");
    let after = t0.elapsed();
    assert!(reason.to_string().contains("revoked"), "{reason}");
    // Every grant on the session is told.
    assert!(
        timeout(Duration::from_millis(100), b.lost().wait())
            .await
            .is_ok()
    );
    eprintln!("lost signal {after:?} after etcdctl lease revoke");
    // The backend gets a new session lease for new acquisitions.
    let c = l
        .try_acquire("job")
        .await
        .unwrap()
        .expect("a new session serves new locks");
    assert_ne!(
        common::lease_of(&client, &prefix, &c).await.unwrap(),
        Some(id)
    );
    assert!(!a.release().await.unwrap());
    assert!(c.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_waiting_acquire_deletes_its_waiter_key() {
    let ep = require_service!(Service::Etcd);
    let prefix = common::prefix("drop-waiter");
    let client = common::raw(&ep).await;
    let holder = common::locker(common::backend(&ep, &prefix, LeaseMode::Session).await);
    let waiter = common::locker(common::backend(&ep, &prefix, LeaseMode::Session).await);
    let lease = holder.try_acquire("job").await.unwrap().unwrap();
    let range = format!("{prefix}job/");
    let task = tokio::spawn(async move { waiter.acquire("job", Duration::from_secs(30)).await });
    assert_eq!(
        wait_keys(&client, &range, 2).await,
        2,
        "the waiter did not queue"
    );
    task.abort();
    let t0 = Instant::now();
    assert_eq!(
        wait_keys(&client, &range, 1).await,
        1,
        "the dropped waiter's key stayed"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t0.elapsed()
    );
    assert!(lease.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_dropped_acquires_leave_no_key() {
    use rand::Rng;
    let ep = require_service!(Service::Etcd);
    let prefix = common::prefix("drops");
    let client = common::raw(&ep).await;
    let a = common::locker(common::backend(&ep, &prefix, LeaseMode::Session).await);
    let b = common::locker(common::backend(&ep, &prefix, LeaseMode::PerLock).await);
    let holder = a.try_acquire("job").await.unwrap().unwrap();
    for i in 0..1_000u32 {
        let l = if i % 2 == 0 { &a } else { &b };
        let micros = rand::rng().random_range(0..4_000u64);
        let fut = async {
            if i % 3 == 0 {
                l.try_acquire("job").await.map(|_| ())
            } else {
                l.acquire("job", Duration::from_secs(30)).await.map(|_| ())
            }
        };
        let _ = timeout(Duration::from_micros(micros), fut).await;
        if i == 500 {
            // Half-way, let the lock change hands so waiters get granted and dropped too.
            assert!(holder.release().await.unwrap());
        }
    }
    // The dropped acquisitions finish in the background: a request that was sent is seen
    // through, then its key deleted (and, on `a`, its in-process permit given back). So the
    // first zero count may come before the last abandoned write lands: wait until there have
    // been no keys for a full second, and `a`'s permits are all back (bounded).
    let give_up = Instant::now() + Duration::from_secs(15);
    let mut empty_since: Option<Instant> = None;
    loop {
        let n = match common::count(&client, &prefix).await {
            Ok(n) => n,
            Err(e) => panic!("count {prefix}: {e}"),
        };
        empty_since = if n == 0 {
            empty_since.or(Some(Instant::now()))
        } else {
            None
        };
        if empty_since.is_some_and(|t| t.elapsed() >= Duration::from_secs(1)) {
            match a.try_acquire("job").await.unwrap() {
                Some(lease) => {
                    assert!(lease.release().await.unwrap());
                    break;
                }
                None => empty_since = None,
            }
        }
        assert!(
            Instant::now() < give_up,
            "after 15 s: {n} keys left under {prefix}, or the lock still taken in-process"
        );
        sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        wait_keys(&client, &prefix, 0).await,
        0,
        "keys left under {prefix}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_errors_are_typed_and_never_show_the_password() {
    let ep = require_service!(Service::Etcd);
    // This member runs without authentication: etcd refuses to authenticate anyone.
    let url = format!("etcd://alice:hunter2@{}", ep.url());
    let err = connect_url(&url).await.unwrap_err();
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    // Nothing listens on port 1.
    let t0 = Instant::now();
    let err = connect_url("etcd://127.0.0.1:1?timeout_ms=500&connect_timeout_ms=300")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t0.elapsed()
    );
    let err = connect_url("etcd://nohost").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig);
}

async fn connect_url(url: &str) -> Result<leasehold_etcd::EtcdBackend, leasehold_core::Error> {
    leasehold_etcd::EtcdBackend::connect(leasehold_etcd::EtcdConfig::from_url(url)?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_does_not_see_the_holders_of_a_longer_key() {
    let ep = require_service!(Service::Etcd);
    let prefix = common::prefix("prefix-free");
    let one = common::locker(common::backend(&ep, &prefix, LeaseMode::Session).await);
    let two = common::locker(common::backend(&ep, &prefix, LeaseMode::Session).await);
    let inner = one.try_acquire("a/b").await.unwrap().expect("a/b is free");
    // Before names were escaped, `a`'s range `{prefix}a/` held the key of `a/b`.
    assert_eq!(two.inspect("a").await.unwrap(), None, "a looks held");
    let outer = two.try_acquire("a").await.unwrap().expect("a is free");
    assert!(outer.fencing_token() > inner.fencing_token());
    assert!(outer.release().await.unwrap());
    assert!(inner.release().await.unwrap());
}
