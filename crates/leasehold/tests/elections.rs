//! Building electors through LockConfig: the requirement applies, a backend without elections
//! (or, on etcd, without semaphores) is refused with its reason.

#![allow(unused_imports)]

use std::time::Duration;

use leasehold::{Candidate, ErrorKind, LockConfig, Require};
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};

fn candidate(v: &str) -> Candidate {
    Candidate::new(v).unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn memory_elector_through_config() {
    let cfg = LockConfig::from_toml_str("url = \"memory://\"\nttl = \"2s\"").unwrap();
    let e = cfg.build_elector("svc", candidate("a")).await.unwrap();
    let lead = e.campaign_for(Duration::from_secs(5)).await.unwrap();
    assert_eq!(e.leader().await.unwrap().map(|l| l.term), Some(lead.term()));
    let e = cfg
        .with_require(Require::Correctness)
        .build_elector("svc", candidate("b"))
        .await;
    assert!(e.is_err(), "memory elections are not for correctness");
}

#[cfg(feature = "redis")]
#[tokio::test]
async fn redlock_refuses_and_redis_is_not_correctness() {
    let ep = require_service!(Service::Redlock);
    let urls: Vec<String> = ep.urls().iter().map(|u| format!("{u:?}")).collect();
    let toml = format!("urls = [{}]\nttl = \"5s\"", urls.join(", "));
    let err = LockConfig::from_toml_str(&toml)
        .unwrap()
        .build_elector("svc", candidate("a"))
        .await
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
    assert!(err.to_string().contains("elections"), "{err}");

    let ep = require_service!(Service::Redis);
    let toml = format!("url = {:?}\nrequire = \"correctness\"", ep.url());
    let err = LockConfig::from_toml_str(&toml)
        .unwrap()
        .build_elector("svc", candidate("a"))
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("correctness"), "{err}");
}

#[cfg(feature = "etcd")]
#[tokio::test]
async fn etcd_elector_serves_correctness() {
    let ep = require_service!(Service::Etcd);
    let prefix = unique_prefix("facade-elect");
    let toml = format!(
        "url = \"etcd://{}\"\nttl = \"5s\"\nrequire = \"correctness\"\nkey_prefix = {prefix:?}",
        ep.raw()
    );
    let cfg = LockConfig::from_toml_str(&toml).unwrap();
    let e = cfg.build_elector("svc", candidate("node-1")).await.unwrap();
    let lead = e.campaign_for(Duration::from_secs(10)).await.unwrap();
    let seen = e.leader().await.unwrap().unwrap();
    assert_eq!((seen.value.as_str(), seen.term), ("node-1", lead.term()));
    assert!(lead.resign().await.unwrap());

    // The same etcd gives no semaphores yet: refused with the reason, not with a lock.
    let err = cfg.build_semaphore(2).await.err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    assert!(
        err.to_string().contains("semaphores: not built yet"),
        "{err}"
    );
}
