//! Liveness follows the TTL: each lock goes on the session lease of its own TTL (rounded up to
//! whole seconds, at least 2 s), so a crashed holder's lock is free within that; and a password
//! over plain gRPC to a remote endpoint is warned about or refused.

mod common;

use std::time::Duration;

use leasehold_core::{ErrorKind, LockBackend, Renewal};
use leasehold_etcd::{EtcdBackend, EtcdConfig, LeaseMode};
use leasehold_test_support::services::Service;
use leasehold_test_support::{harness, require_service};

/// The TTL etcd granted to the lease that carries `lease`'s key.
async fn granted_ttl(
    client: &etcd_client::Client,
    prefix: &str,
    lease: &leasehold_core::Lease,
) -> i64 {
    let id = common::lease_of(client, prefix, lease)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or_else(|| panic!("no key holds {lease:?}"));
    let ttl = client
        .lease_client()
        .time_to_live(id, None)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    ttl.granted_ttl()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_ttl_has_a_session_lease_of_its_own() {
    let ep = require_service!(Service::Etcd);
    let prefix = common::prefix("ttl-sessions");
    let client = common::raw(&ep).await;
    // The backend's session_ttl is 5 s; the locks' TTLs decide their leases.
    let backend = common::backend(&ep, &prefix, LeaseMode::Session).await;
    let caps = backend.capabilities();
    let s = Duration::from_secs;
    assert_eq!(caps.crash_release_bound(s(3)), Some(s(3)));
    assert_eq!(
        caps.crash_release_bound(Duration::from_millis(2_500)),
        Some(s(3))
    );
    assert_eq!(caps.crash_release_bound(s(1)), Some(s(2)));
    let locker = |ttl| harness::locker(backend.clone(), ttl, Renewal::Auto);
    let short = locker(s(3)).try_acquire("short").await.unwrap().unwrap();
    let short2 = locker(Duration::from_millis(2_500))
        .try_acquire("short2")
        .await
        .unwrap()
        .unwrap();
    let long = locker(s(7)).try_acquire("long").await.unwrap().unwrap();
    assert_eq!(granted_ttl(&client, &prefix, &short).await, 3);
    assert_eq!(granted_ttl(&client, &prefix, &long).await, 7);
    // 2.5 s rounds up to 3 s: the same shared session lease as `short`.
    assert_eq!(
        common::lease_of(&client, &prefix, &short2).await.unwrap(),
        common::lease_of(&client, &prefix, &short).await.unwrap()
    );
    assert_eq!(
        backend.session_lease_id_for(s(3)).await,
        common::lease_of(&client, &prefix, &short).await.unwrap()
    );
    for lease in [short, short2, long] {
        assert!(lease.release().await.unwrap());
    }
}

#[tokio::test]
async fn a_password_over_plain_grpc_to_a_remote_endpoint_warns_or_is_refused() {
    // 192.0.2.1 (TEST-NET-1) is never routed: the warning comes before connecting fails.
    let url = "etcd://root:hunter2@192.0.2.1:2379?connect_timeout_ms=300&timeout_ms=300";
    let logs = leasehold_test_support::logs::capture();
    let err = EtcdBackend::connect(EtcdConfig::from_url(url).unwrap())
        .await
        .expect_err("connected to TEST-NET-1");
    assert_ne!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    let text = logs.text();
    assert!(
        text.contains("in clear") && text.contains("192.0.2.1"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");

    let refused = format!("{url}&allow_plaintext_password=false");
    let err = EtcdBackend::connect(EtcdConfig::from_url(&refused).unwrap())
        .await
        .expect_err("connected to TEST-NET-1");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(
        err.to_string().contains("allow_plaintext_password"),
        "{err}"
    );
    assert!(!err.to_string().contains("hunter2"), "{err}");

    // Loopback, or no password: nothing to warn about.
    let logs = leasehold_test_support::logs::capture();
    for quiet in [
        "etcd://root:hunter2@127.0.0.1:1?connect_timeout_ms=100&timeout_ms=100&allow_plaintext_password=false",
        "etcd://192.0.2.1:2379?connect_timeout_ms=100&timeout_ms=100&allow_plaintext_password=false",
    ] {
        let err = EtcdBackend::connect(EtcdConfig::from_url(quiet).unwrap())
            .await
            .expect_err("nothing listens there");
        assert_ne!(err.kind(), ErrorKind::InvalidConfig, "{quiet}: {err}");
    }
    assert!(!logs.text().contains("in clear"), "{}", logs.text());
}
