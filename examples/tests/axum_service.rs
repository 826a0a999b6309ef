//! The axum example's router, driven request by request (no socket), on the in-memory
//! backend and, switched by configuration alone, on the real PostgreSQL service.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use leasehold::{FencingToken, LockConfig, LockOptions, Locker, MemoryBackend, Renewal};
use leasehold_examples::counters::{Store, Write, load_config, router};
use leasehold_test_support::require_service;
use leasehold_test_support::services::{Service, unique_prefix};
use metrics_exporter_prometheus::PrometheusBuilder;
use tower::ServiceExt;

async fn call(app: &Router, method: &str, uri: &str) -> (StatusCode, String) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(req).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// The fencing token in "a = 2 (fencing token 7)".
fn token_of(body: &str) -> u64 {
    body.rsplit("fencing token ")
        .next()
        .and_then(|t| t.trim().trim_end_matches(')').parse().ok())
        .unwrap_or_else(|| panic!("no token in {body:?}"))
}

#[tokio::test]
async fn increments_run_under_the_lock_and_metrics_are_rendered() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _guard = metrics::set_default_local_recorder(&recorder);

    let config = load_config(None).unwrap();
    let locker = config.build().await.unwrap();
    assert_eq!(locker.backend().capabilities().name, "memory");
    let store = Store::new();
    let app = router(
        locker.clone(),
        Duration::from_millis(100),
        store.clone(),
        Some(handle),
    );

    let (status, first) = call(&app, "POST", "/counters/a/increment").await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, second) = call(&app, "POST", "/counters/a/increment").await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert!(second.starts_with("a = 2 "), "{second}");
    assert!(token_of(&second) > token_of(&first));
    assert_eq!(call(&app, "GET", "/counters/a").await.1, "a = 2\n");

    // Someone else holds the counter's lock past the wait budget: 409, and no write.
    let held = locker
        .acquire("counters/a", Duration::from_secs(1))
        .await
        .unwrap();
    let (status, body) = call(&app, "POST", "/counters/a/increment").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(store.get("a"), 2);
    drop(held);

    let (status, text) = call(&app, "GET", "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let route = r#"route="POST /counters/{name}/increment""#;
    assert!(
        text.contains(&format!(
            "leasehold_requests_total{{{route},outcome=\"ok\"}} 2\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "leasehold_requests_total{{{route},outcome=\"timeout\"}} 1\n"
        )),
        "{text}"
    );
    assert!(
        text.contains("leasehold_acquire_timeouts_total{backend=\"memory\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "leasehold_acquire_seconds_count{backend=\"memory\",outcome=\"acquired\"} 3\n"
        ),
        "{text}"
    );
}

#[tokio::test]
async fn a_lease_lost_while_the_handler_works_is_503_and_nothing_is_written() {
    let locker = Locker::new(MemoryBackend::new())
        .with_options(
            LockOptions::default()
                .with_ttl(Duration::from_millis(100))
                .with_renewal(Renewal::Off),
        )
        .unwrap();
    let store = Store::new();
    let app = router(locker, Duration::from_secs(1), store.clone(), None);
    let (status, body) = call(&app, "POST", "/counters/b/increment?work_ms=400").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(store.get("b"), 0);
    let (status, _) = call(&app, "POST", "/counters/b/increment").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(store.get("b"), 1);
}

#[tokio::test]
async fn the_store_refuses_a_write_with_a_stale_token() {
    let store = Store::new();
    let write = |value, token| Write {
        counter: "c".to_owned(),
        value,
        token: FencingToken::new(token),
    };
    assert_eq!(store.service().oneshot(write(1, 7)).await.unwrap(), 1);
    let err = store.service().oneshot(write(2, 6)).await.unwrap_err();
    assert!(err.to_string().contains("stale fencing token 6"), "{err}");
    assert_eq!(store.get("c"), 1);
    assert_eq!(store.highest_token("c"), Some(FencingToken::new(7)));
}

#[tokio::test]
async fn the_backend_is_switched_by_configuration_alone() {
    let ep = require_service!(Service::Postgres);
    let dir = std::env::temp_dir().join(unique_prefix("axum-example"));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("locks.toml");
    let prefix = format!("{}:", unique_prefix("axum-example"));
    std::fs::write(
        &file,
        format!(
            "url = {:?}\nrequire = \"correctness\"\nttl = \"5s\"\nkey_prefix = {prefix:?}\n",
            ep.url()
        ),
    )
    .unwrap();
    let config: LockConfig = load_config(Some(&file)).unwrap();
    let locker = config.build().await.unwrap();
    assert_eq!(locker.backend().capabilities().name, "postgres");
    let store = Store::new();
    let app = router(locker, config.wait_budget(), store.clone(), None);
    let (status, first) = call(&app, "POST", "/counters/d/increment").await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, second) = call(&app, "POST", "/counters/d/increment").await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert!(token_of(&second) > token_of(&first));
    assert_eq!(store.get("d"), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}
