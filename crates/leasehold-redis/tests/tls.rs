//! `rediss://` against a real TLS Redis (the harness's `redis-tls` node, with a certificate from
//! a throwaway CA that names 127.0.0.1 and localhost).

// Helpers outside #[test] fns fail the test by panicking, like the tests themselves.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use leasehold_core::{ErrorKind, LockOptions, Locker, Renewal};
use leasehold_redis::{RedisBackend, RedisConfig};
use leasehold_test_support::require_service;
use leasehold_test_support::services::{self, Service};

fn ca() -> std::path::PathBuf {
    services::tls_ca().expect("the harness's TLS CA (LEASEHOLD_TEST_TLS_CA)")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_with_the_servers_ca() {
    let ep = require_service!(Service::RedisTls);
    for url in [
        ep.url().to_owned(),
        ep.url().replace("127.0.0.1", "localhost"),
    ] {
        let config = RedisConfig::from_url(&url)
            .unwrap()
            .with_prefix(common::prefix("tls"))
            .unwrap()
            .with_tls_ca_file(ca())
            .unwrap();
        let backend = RedisBackend::connect(config).await.unwrap();
        let l = Locker::new(backend)
            .with_options(LockOptions::default().with_renewal(Renewal::Off))
            .unwrap();
        let a = l.try_acquire("k").await.unwrap().expect("free");
        assert!(a.fencing_token().is_some());
        assert!(l.try_acquire("k").await.unwrap().is_none());
        // Waiting works over TLS too: the wake-up arrives on the same encrypted connection.
        let waiter = {
            let l = l.clone();
            tokio::spawn(async move { l.acquire("k", Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(a.release().await.unwrap());
        let b = waiter.await.unwrap().unwrap();
        assert!(b.fencing_token() > a.fencing_token());
        assert!(b.release().await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_refused_with_a_clear_error() {
    let ep = require_service!(Service::RedisTls);
    // The system roots do not include the harness's throwaway CA.
    let url = ep.url().replacen("rediss://", "rediss://user:s3cret@", 1);
    let err = RedisBackend::connect(RedisConfig::from_url(&url).unwrap())
        .await
        .expect_err("an unknown CA must not be trusted");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(!err.to_string().contains("s3cret"), "{err}");
    eprintln!("refused as it should be: {err}");

    let missing = RedisConfig::from_url(ep.url())
        .unwrap()
        .with_tls_ca_file("/nonexistent/ca.pem")
        .expect_err("a missing CA file is a config error");
    assert_eq!(missing.kind(), ErrorKind::InvalidConfig);
    assert!(
        missing.to_string().contains("/nonexistent/ca.pem"),
        "{missing}"
    );
}
