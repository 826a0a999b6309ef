//! ConcurrencyLimitLayer: at most N requests in flight per key, 503 with Retry-After when no
//! permit comes within the budget, keys independent, permits back when responses are ready.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use leasehold_core::{MemoryBackend, Semaphore};
use leasehold_tower::{ConcurrencyLimitLayer, StatusMap};
use tower::{Layer, ServiceExt, service_fn};

type Req = Request<String>;

fn by_path(req: &Req) -> Option<String> {
    Some(req.uri().path().trim_start_matches('/').to_owned())
}

fn get(path: &str) -> Req {
    Request::builder().uri(path).body(String::new()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_n_in_flight_per_key_then_503_with_retry_after() {
    let sem = Semaphore::new(MemoryBackend::new(), 2).unwrap();
    let (inside, peak) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let svc = {
        let (inside, peak) = (Arc::clone(&inside), Arc::clone(&peak));
        ConcurrencyLimitLayer::new(&sem, by_path)
            .wait(Duration::from_millis(100))
            .layer(service_fn(move |_req: Req| {
                let (inside, peak) = (Arc::clone(&inside), Arc::clone(&peak));
                async move {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    peak.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    Ok::<_, Infallible>(Response::new("done".to_owned()))
                }
            }))
    };
    let calls: Vec<_> = (0..5)
        .map(|_| tokio::spawn(svc.clone().oneshot(get("/exports"))))
        .collect();
    let other = svc.clone().oneshot(get("/imports")).await.unwrap();
    assert_eq!(
        other.status(),
        StatusCode::OK,
        "another key has its own permits"
    );
    let mut statuses = Vec::new();
    for call in calls {
        let response = call.await.unwrap().unwrap();
        if response.status() == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(response.headers()["retry-after"], "1");
        }
        statuses.push(response.status());
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 2, "{statuses:?}");
    assert_eq!(statuses.len() - ok, 3, "{statuses:?}");
    assert!(
        peak.load(Ordering::SeqCst) <= 3,
        "two exports and one import at most"
    );
    // A permit goes back in the background once its response is ready: wait for that.
    assert!(leasehold_core::settle(Duration::from_secs(10)).await);
    assert_eq!(
        sem.holders("exports").await.unwrap().len(),
        0,
        "permits given back"
    );
    let after = svc.oneshot(get("/exports")).await.unwrap();
    assert_eq!(after.status(), StatusCode::OK);
}

#[tokio::test]
async fn the_answer_is_configurable() {
    let sem = Semaphore::new(MemoryBackend::new(), 1).unwrap();
    let _busy = sem.try_acquire("k").await.unwrap().unwrap();
    let svc = ConcurrencyLimitLayer::new(&sem, by_path)
        .status_map(StatusMap::default().retry_after(Some(7)))
        .layer(service_fn(|_req: Req| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    let response = svc.oneshot(get("/k")).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(response.headers()["retry-after"], "7");
}
