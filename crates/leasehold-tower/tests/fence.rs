//! FenceLayer, the in-memory and PostgreSQL stores, and Kleppmann's scenario through both
//! layers.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{HeaderValue, Request};
use leasehold_core::{FencingToken, LeaseInfo, LockOptions, Locker, MemoryBackend, Renewal};
use leasehold_tower::{FenceError, FenceLayer, LockError, LockLayer, MemoryFenceStore, OnLost};
use tower::{Layer, ServiceExt, service_fn};
use tower_test::mock;

type Req = Request<String>;

/// Reads `x-resource` and `x-fence` headers.
fn fence_of(req: &Req) -> Option<(String, FencingToken)> {
    let resource = req.headers().get("x-resource")?.to_str().ok()?.to_owned();
    let token = req.headers().get("x-fence")?.to_str().ok()?.parse().ok()?;
    Some((resource, FencingToken::new(token)))
}

fn write(resource: &'static str, token: Option<u64>, body: &str) -> Req {
    let mut req = Request::new(body.to_owned());
    let headers = req.headers_mut();
    headers.insert("x-resource", HeaderValue::from_static(resource));
    if let Some(t) = token {
        headers.insert("x-fence", HeaderValue::from(t));
    }
    req
}

#[tokio::test]
async fn fence_admits_rising_and_equal_tokens_and_rejects_lower_ones() {
    let layer = FenceLayer::new(fence_of);
    let store = Arc::clone(layer.store());
    let (mut svc, mut handle) = mock::spawn_layer::<Req, &'static str, _>(layer);

    for (token, expect_ok) in [
        (5, true),
        (7, true),
        (7, true),
        (6, false),
        (8, true),
        (1, false),
    ] {
        tokio_test::assert_ready_ok!(svc.poll_ready());
        let call = tokio::spawn(svc.call(write("invoice/1", Some(token), "w")));
        if expect_ok {
            let (req, send) = handle.next_request().await.unwrap();
            assert_eq!(fence_of(&req).map(|f| f.1.get()), Some(token));
            send.send_response("stored");
            assert_eq!(call.await.unwrap().unwrap(), "stored");
        } else {
            match call.await.unwrap().unwrap_err() {
                FenceError::Stale {
                    resource,
                    token: t,
                    highest,
                } => {
                    assert_eq!(resource, "invoice/1");
                    assert_eq!(t.get(), token);
                    assert!(highest.get() > token);
                }
                other => panic!("expected Stale, got {other:?}"),
            }
            let next = tokio::time::timeout(Duration::from_millis(20), handle.next_request()).await;
            assert!(next.is_err(), "a stale write reached the service");
            // The service instance readied for the rejected call was dropped with its future.
        }
    }
    assert_eq!(store.highest("invoice/1"), Some(FencingToken::new(8)));
    // Resources are independent.
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let call = tokio::spawn(svc.call(write("invoice/2", Some(2), "w")));
    handle
        .next_request()
        .await
        .unwrap()
        .1
        .send_response("stored");
    assert!(call.await.unwrap().is_ok());
}

#[tokio::test]
async fn fence_rejects_a_request_without_a_token() {
    let (mut svc, mut handle) =
        mock::spawn_layer::<Req, &'static str, _>(FenceLayer::new(fence_of));
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let err = svc.call(write("invoice/1", None, "w")).await.unwrap_err();
    assert!(matches!(err, FenceError::MissingToken), "{err:?}");
    let next = tokio::time::timeout(Duration::from_millis(20), handle.next_request()).await;
    assert!(next.is_err());
}

/// Kleppmann's scenario, through both layers: holder 1 takes the lease, pauses past its TTL,
/// holder 2 takes the lease and writes with a higher token, holder 1 wakes and writes: the
/// storage's FenceLayer rejects the late write, and holder 1's LockLayer reports the loss.
#[tokio::test]
async fn kleppmann_a_paused_holders_late_write_is_rejected() {
    // Storage: a FenceLayer in front of a log of accepted writes.
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let log_w = Arc::clone(&log);
    let fence_store = Arc::new(MemoryFenceStore::new());
    let storage = FenceLayer::with_store(fence_of, Arc::clone(&fence_store)).layer(service_fn(
        move |req: Req| {
            let log = Arc::clone(&log_w);
            async move {
                log.lock().unwrap().push(req.into_body());
                Ok::<_, Infallible>("stored")
            }
        },
    ));

    // Clients: a LockLayer around a handler that, given a pause, sleeps, then writes to the
    // storage with the lease's fencing token. Renewal is off, as in a process that is paused.
    let locker = Locker::new(MemoryBackend::new())
        .with_options(
            LockOptions::default()
                .with_ttl(Duration::from_millis(300))
                .with_renewal(Renewal::Off),
        )
        .unwrap();
    let client = {
        let storage = storage.clone();
        let handler = service_fn(move |req: Request<(&'static str, u64)>| {
            let storage = storage.clone();
            async move {
                let (who, pause_ms) = *req.body();
                let lease = req.extensions().get::<LeaseInfo>().cloned().unwrap();
                let token = lease.fencing.unwrap();
                tokio::time::sleep(Duration::from_millis(pause_ms)).await; // the GC pause
                let outcome = storage
                    .oneshot(write("file", Some(token.get()), who))
                    .await
                    .map(|_| format!("{who} stored with token {token}"))
                    .map_err(|e| e.to_string());
                Ok::<_, Infallible>((token, outcome))
            }
        });
        LockLayer::new(locker.clone(), |_: &Request<(&'static str, u64)>| {
            Some("file".to_owned())
        })
        .wait(Duration::from_secs(2))
        .on_lost(OnLost::Finish)
        .layer(handler)
    };

    let holder1 = tokio::spawn(client.clone().oneshot(Request::new(("holder-1", 700))));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let holder2 = tokio::spawn(client.clone().oneshot(Request::new(("holder-2", 0))));

    // Holder 2 gets the lock once holder 1's lease expires, and writes first.
    let (t2, outcome2) = holder2.await.unwrap().unwrap();
    assert!(outcome2.is_ok(), "{outcome2:?}");

    // Holder 1 wakes up and writes with its old token: rejected by the fence.
    match holder1.await.unwrap() {
        Err(LockError::LeaseLost { key, completed, .. }) => {
            assert_eq!(key.as_str(), "file");
            let (t1, outcome1) = completed.and_then(|c| c.take()).unwrap().unwrap();
            assert!(t1 < t2, "tokens {t1} < {t2}");
            let e = outcome1.unwrap_err();
            assert!(e.contains("stale fencing token"), "{e}");
        }
        other => panic!("holder 1 should report the lost lease, got {other:?}"),
    }
    assert_eq!(*log.lock().unwrap(), vec!["holder-2".to_owned()]);
    assert_eq!(fence_store.highest("file"), Some(t2));
}

#[test]
fn fence_errors_have_http_statuses() {
    use http::StatusCode;
    let stale: FenceError<Infallible> = FenceError::Stale {
        resource: "r".to_owned(),
        token: FencingToken::new(1),
        highest: FencingToken::new(2),
    };
    assert_eq!(stale.status(), Some(StatusCode::CONFLICT));
    let missing: FenceError<Infallible> = FenceError::MissingToken;
    assert_eq!(missing.status(), Some(StatusCode::BAD_REQUEST));
    let store: FenceError<Infallible> = FenceError::Store(leasehold_core::Error::new(
        leasehold_core::ErrorKind::Unavailable,
        "fence",
        "down",
    ));
    assert_eq!(store.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    let inner: FenceError<std::io::Error> = FenceError::Service(std::io::Error::other("x"));
    assert_eq!(inner.status(), None);
}
