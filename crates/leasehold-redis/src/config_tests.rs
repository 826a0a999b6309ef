//! Unit tests of `config.rs`.

use super::*;

/// Found by the `url` fuzz target: a CA path holding the rest of the query was shown.
#[test]
fn an_unreadable_ca_file_is_named_without_secrets() {
    let e = RedisConfig::from_url("rediss://h?ca=/nonexistent?password=Hx7SECRETq")
        .err()
        .map(|e| format!("{e} {e:?}"))
        .unwrap_or_default();
    assert!(e.contains("CA file") && !e.contains("SECRET"), "{e}");
}

#[test]
fn passwords_never_show() {
    assert_eq!(
        redact("redis://user:s3cret@h:1/0"),
        "redis://user:***@h:1/0"
    );
    assert_eq!(redact("redis://:s3cret@h:1"), "redis://:***@h:1");
    assert_eq!(
        redact("redis://h:1/0?password=s3cret"),
        "redis://h:1/0?password=***"
    );
    let c = RedisConfig::from_url("redis://user:s3cret@127.0.0.1:1/2").unwrap();
    assert!(!format!("{c:?}").contains("s3cret"));
    let r =
        RedlockConfig::from_url("redlock://u:s3cret@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3").unwrap();
    assert_eq!(r.nodes(), 3);
    assert_eq!(r.quorum(), 2);
    assert!(!format!("{r:?}").contains("s3cret"));
    let bad = RedisConfig::from_url("redis://u:s3cret@[::1")
        .err()
        .unwrap();
    assert!(!bad.to_string().contains("s3cret"), "{bad}");
}

#[test]
fn fair_mode_is_a_url_option() -> Result<(), Error> {
    let c = RedisConfig::from_url("redis://127.0.0.1:1/2?fair_queue_ms=750")?;
    assert_eq!(c.fair, Some(Duration::from_millis(750)));
    assert_eq!(c.redacted_url(), "redis://127.0.0.1:1/2");
    let c = RedisConfig::from_url("redis://127.0.0.1:1?protocol=resp3&fair_queue_ms=200")?;
    assert_eq!(c.fair, Some(Duration::from_millis(200)));
    assert_eq!(c.redacted_url(), "redis://127.0.0.1:1?protocol=resp3");
    let c = RedisConfig::from_url("redis-cluster://127.0.0.1:1,127.0.0.1:2?fair_queue_ms=100")?;
    assert_eq!(c.fair, Some(Duration::from_millis(100)));
    assert_eq!(RedisConfig::from_url("redis://127.0.0.1:1")?.fair, None);
    for bad in ["fair_queue_ms=50", "fair_queue_ms=soon", "fair_queue_ms="] {
        let e = RedisConfig::from_url(&format!("redis://127.0.0.1:1?{bad}"))
            .err()
            .map(|e| e.kind());
        assert_eq!(e, Some(ErrorKind::InvalidConfig), "{bad}");
    }
    Ok(())
}

#[test]
fn every_option_is_a_url_option() -> Result<(), Error> {
    let ca = std::env::temp_dir().join(format!("leasehold-redis-ca-{}.pem", std::process::id()));
    std::fs::write(&ca, b"-----BEGIN CERTIFICATE-----\n")
        .map_err(|e| invalid(REDIS, e.to_string()))?;
    let url = format!(
        "rediss://127.0.0.1:1/3?prefix=app%3A&ca={}&connect_timeout_ms=7&protocol=resp3\
         &response_timeout_ms=8&wait_initial_ms=9&wait_max_ms=900&releases_in_flight=7",
        ca.display()
    );
    let c = RedisConfig::from_url(&url)?;
    assert_eq!(c.prefix, "app:");
    assert!(c.tls_ca.is_some());
    assert_eq!(c.connect_timeout, Duration::from_millis(7));
    assert_eq!(c.response_timeout, Duration::from_millis(8));
    assert_eq!(c.wait_backoff.initial, Duration::from_millis(9));
    assert_eq!(c.wait_backoff.max, Duration::from_millis(900));
    assert_eq!(c.releases_in_flight, 7);
    // What is not ours stays for redis-rs.
    assert_eq!(c.redacted_url(), "rediss://127.0.0.1:1/3?protocol=resp3");
    let r = RedlockConfig::from_url(&format!(
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3/1?prefix=p:&ca={}&node_timeout_ms=20\
         &connect_timeout_ms=30&min_validity_ms=40&releases_in_flight=5",
        ca.display()
    ))?;
    let _ = std::fs::remove_file(&ca);
    assert_eq!(r.prefix, "p:");
    assert!(r.tls_ca.is_some());
    assert_eq!(r.node_timeout, Some(Duration::from_millis(20)));
    assert_eq!(r.connect_timeout, Duration::from_millis(30));
    assert_eq!(r.min_validity, Duration::from_millis(40));
    assert_eq!(r.releases_in_flight, 5);
    for bad in [
        "redis://127.0.0.1:1?connect_timeout_ms=soon",
        "redis://127.0.0.1:1?prefix=a{b",
        "redis://127.0.0.1:1?ca=/nonexistent/ca.pem",
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?node_timeout_ms=-1",
        "redis://127.0.0.1:1?releases_in_flight=0",
        "redis://127.0.0.1:1?releases_in_flight=many",
        "redlock://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3?releases_in_flight=0",
    ] {
        let e = RedisConfig::from_url(bad)
            .err()
            .or_else(|| RedlockConfig::from_url(bad).err())
            .map(|e| e.kind());
        assert_eq!(e, Some(ErrorKind::InvalidConfig), "{bad}");
    }
    Ok(())
}

#[test]
fn redlock_rejects_too_few_and_duplicate_nodes() {
    let few = RedlockConfig::from_url("redlock://127.0.0.1:1,127.0.0.1:2")
        .err()
        .unwrap();
    assert_eq!(few.kind(), ErrorKind::InvalidConfig);
    assert!(few.to_string().contains("at least 3"), "{few}");
    let dup = RedlockConfig::from_urls([
        "redis://127.0.0.1:1",
        "redis://127.0.0.1:2",
        "redis://127.0.0.1:1",
    ])
    .err()
    .unwrap();
    assert!(dup.to_string().contains("listed twice"), "{dup}");
    assert!(
        RedisConfig::from_url("redis://h:1")
            .unwrap()
            .with_prefix("a{")
            .is_err()
    );
}

/// The size set in the configuration is the size of the backend's release gate (Redlock's
/// nodes connect on first use: no server needed), and the default is the core's.
#[tokio::test]
async fn the_release_gate_has_the_configured_size() -> Result<(), Error> {
    use leasehold_core::{LockBackend, RELEASES_IN_FLIGHT};
    let nodes = [
        "redis://127.0.0.1:1",
        "redis://127.0.0.1:2",
        "redis://127.0.0.1:3",
    ];
    let size = |b: &crate::RedlockBackend| b.release_gate().map(|g| g.size());
    let default = crate::RedlockBackend::new(RedlockConfig::from_urls(nodes)?)?;
    assert_eq!(size(&default), Some(RELEASES_IN_FLIGHT));
    let set = RedlockConfig::from_urls(nodes)?.with_releases_in_flight(3)?;
    assert_eq!(size(&crate::RedlockBackend::new(set)?), Some(3));
    let refused = RedisConfig::from_url("redis://127.0.0.1:1")?.with_releases_in_flight(0);
    assert_eq!(
        refused.err().map(|e| e.kind()),
        Some(ErrorKind::InvalidConfig)
    );
    Ok(())
}
