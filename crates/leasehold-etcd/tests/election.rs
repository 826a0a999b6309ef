//! Elections on etcd: the election checks in both lease modes, and interoperation with
//! `etcdctl elect` both ways (it competes with our candidates; `--listen` observes ours).

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::GetOptions;
use leasehold_core::{Candidate, Elector, Lease, LockBackend, LockKey};
use leasehold_etcd::{LeaseMode, election_name};
use leasehold_test_support::conformance::election::ElectionTarget;
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Endpoints, Service};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::timeout;

/// Two backends under one fresh prefix; a lapse revokes the leader's lease.
async fn target(mode: LeaseMode, name: &str) -> Option<ElectionTarget> {
    let endpoints = leasehold_test_support::services::require(Service::Etcd)?;
    let prefix = common::prefix(name);
    let primary: Arc<dyn LockBackend> = Arc::new(common::backend(&endpoints, &prefix, mode).await);
    let other: Arc<dyn LockBackend> = Arc::new(common::backend(&endpoints, &prefix, mode).await);
    let client = common::raw(&endpoints).await;
    let expire = common::expire_hook(move |lease: &Lease| {
        let (client, range) = (
            client.clone(),
            format!("{}/", election_name(&prefix, lease.key())),
        );
        Box::pin(async move {
            let leader = first_lease(&client, &range).await;
            if let Err(e) = client.lease_client().revoke(leader).await {
                panic!("revoke {leader:x}: {e}");
            }
        })
    });
    // A native wait: the hand-over is one watch event, far under the session TTL.
    Some(
        ElectionTarget::new(
            primary,
            other,
            Duration::from_secs(5),
            Duration::from_secs(2),
        )
        .with_expire(expire),
    )
}

/// The lease of the oldest key under `range` (the leader's).
async fn first_lease(client: &etcd_client::Client, range: &str) -> i64 {
    let opts = GetOptions::new()
        .with_prefix()
        .with_sort(
            etcd_client::SortTarget::Create,
            etcd_client::SortOrder::Ascend,
        )
        .with_limit(1);
    let resp = client.kv_client().get(range, Some(opts)).await;
    match resp.map(|r| r.kvs().first().map(|kv| kv.lease())) {
        Ok(Some(id)) => id,
        other => panic!("no leader key under {range}: {other:?}"),
    }
}

mod session {
    use leasehold_etcd::LeaseMode;
    use leasehold_test_support::conformance::election::ElectionTarget;

    async fn target() -> Option<ElectionTarget> {
        super::target(LeaseMode::Session, "etcd-elect-session").await
    }

    leasehold_test_support::election_tests!(target);
}

mod per_lock {
    use leasehold_etcd::LeaseMode;
    use leasehold_test_support::conformance::election::ElectionTarget;

    async fn target() -> Option<ElectionTarget> {
        super::target(LeaseMode::PerLock, "etcd-elect-per-lock").await
    }

    leasehold_test_support::election_tests!(target);
}

/// Starts `etcdctl elect [ARGS…]` with stdout piped; killed (by its pid) when dropped.
fn etcdctl_elect(endpoints: &Endpoints, args: &[&str]) -> Child {
    let spawned = Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg("--endpoints")
        .arg(endpoints.raw())
        .arg("elect")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn();
    match spawned {
        Ok(c) => c,
        Err(e) => panic!("cannot run etcdctl: {e}"),
    }
}

/// Reads `child`'s stdout lines until one equals `want` (at most 20 s).
async fn read_until(child: &mut Child, want: &str) {
    let Some(out) = child.stdout.take() else {
        panic!("no stdout")
    };
    let mut lines = BufReader::new(out).lines();
    let found = timeout(Duration::from_secs(20), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line == want {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "etcdctl never printed {want:?}");
    child.stdout = None;
    // Keep reading in the background so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
}

async fn elector(ep: &Endpoints, prefix: &str, value: &str) -> Elector {
    let backend: Arc<dyn LockBackend> =
        Arc::new(common::backend(ep, prefix, LeaseMode::Session).await);
    let options = leasehold_test_support::harness::options(
        Duration::from_secs(5),
        leasehold_core::Renewal::Auto,
    );
    let candidate = Candidate::new(value).unwrap_or_else(|e| panic!("{e}"));
    Elector::new(backend, "svc", candidate, options).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_competes_with_our_candidates() {
    let ep = require_service!(Service::Etcd);
    let prefix = common::prefix("etcdctl-elect");
    let key = LockKey::new("svc").unwrap_or_else(|e| panic!("{e}"));
    let name = election_name(&prefix, &key);
    // etcdctl campaigns first and leads: it prints its value once elected.
    let mut theirs = etcdctl_elect(&ep, &[&name, "from-etcdctl"]);
    read_until(&mut theirs, "from-etcdctl").await;
    let ours = elector(&ep, &prefix, "from-leasehold").await;
    let seen = ours.leader().await.unwrap_or_else(|e| panic!("{e}"));
    let theirs_term = match seen {
        Some(l) if l.value.as_str() == "from-etcdctl" => l.term,
        other => panic!("leader() says {other:?}"),
    };
    assert!(
        ours.campaign_for(Duration::from_millis(700)).await.is_err(),
        "we led while etcdctl did"
    );
    // etcdctl resigns when interrupted; then we lead, with a higher term.
    let waiting = tokio::spawn(async move {
        let won = ours.campaign_for(Duration::from_secs(20)).await;
        (ours, won)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    interrupt(&theirs);
    let (ours, won) = waiting.await.unwrap_or_else(|e| panic!("{e}"));
    let won = won.unwrap_or_else(|e| panic!("we never led after etcdctl resigned: {e}"));
    assert!(won.term() > theirs_term);
    assert_eq!(
        ours.leader().await.ok().flatten().map(|l| l.term),
        Some(won.term())
    );
    drop(won);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_listen_observes_ours_and_waits_for_it() {
    let ep = require_service!(Service::Etcd);
    let prefix = common::prefix("etcdctl-listen");
    let key = LockKey::new("svc").unwrap_or_else(|e| panic!("{e}"));
    let name = election_name(&prefix, &key);
    let ours = elector(&ep, &prefix, "leader-value-1").await;
    let won = ours
        .campaign_for(Duration::from_secs(10))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut listener = etcdctl_elect(&ep, &["--listen", &name]);
    read_until(&mut listener, "leader-value-1").await;
    // An etcdctl candidate queues behind us and leads once we resign.
    let mut theirs = etcdctl_elect(&ep, &[&name, "next-in-line"]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let now = ours.leader().await.ok().flatten().map(|l| l.value);
    assert_eq!(now.as_ref().map(Candidate::as_str), Some("leader-value-1"));
    let term = won.term();
    assert!(won.resign().await.unwrap_or_else(|e| panic!("{e}")));
    read_until(&mut theirs, "next-in-line").await;
    let next = ours.leader().await.ok().flatten();
    assert!(
        next.as_ref()
            .is_some_and(|l| l.value.as_str() == "next-in-line" && l.term > term)
    );
    interrupt(&theirs);
}

/// Sends SIGINT to `child` (etcdctl resigns and exits on it).
fn interrupt(child: &Child) {
    let Some(pid) = child.id() else { return };
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status();
    assert!(status.is_ok_and(|s| s.success()), "kill -INT {pid}");
}
