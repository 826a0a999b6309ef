//! LockLayer for `http` services: errors answered as responses, and leases held while a
//! response body streams.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body as _;
use http_body_util::channel::Channel;
use http_body_util::{BodyExt, Full};
use leasehold_core::{Error, ErrorKind, LockOptions, Locker, LossReason, MemoryBackend, Renewal};
use leasehold_tower::{
    ErrorResponseLayer, LeaseBody, LeaseLostError, LockError, LockLayer, OnLost, StatusMap,
};
use tower::{Layer, ServiceBuilder, ServiceExt, service_fn};

type Req = Request<String>;

/// Locks the request's path; `/free` passes through unlocked.
fn by_path(req: &Req) -> Option<String> {
    match req.uri().path() {
        "/free" => None,
        path => Some(path.trim_start_matches('/').to_owned()),
    }
}

fn get(path: &str) -> Req {
    Request::builder().uri(path).body(String::new()).unwrap()
}

async fn ok_handler(_req: Req) -> Result<Response<String>, Infallible> {
    Ok(Response::new("done".to_owned()))
}

async fn text(response: Response<String>) -> (StatusCode, String) {
    (response.status(), response.into_body())
}

async fn eventually_free(locker: &Locker, key: &str) -> bool {
    for _ in 0..100 {
        if let Ok(Some(l)) = locker.try_acquire(key).await {
            drop(l.release().await);
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

fn short_lived(ttl: Duration) -> Locker {
    Locker::new(MemoryBackend::new())
        .with_options(
            LockOptions::default()
                .with_ttl(ttl)
                .with_renewal(Renewal::Off),
        )
        .unwrap()
}

#[tokio::test]
async fn contention_is_409_and_the_handler_is_not_called() {
    let locker = Locker::new(MemoryBackend::new());
    let _held = locker.try_acquire("orders/1").await.unwrap().unwrap();
    let svc = ServiceBuilder::new()
        .layer(ErrorResponseLayer::default())
        .layer(LockLayer::new(locker, by_path))
        .service(service_fn(|_req: Req| async {
            panic!("the handler ran without the lock");
            #[allow(unreachable_code)]
            Ok::<Response<String>, Infallible>(Response::new(String::new()))
        }));
    let (status, body) = text(svc.oneshot(get("/orders/1")).await.unwrap()).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(body.contains("locked by another request"), "{body}");
    assert!(!body.contains("orders/1"), "the key must not leak: {body}");
}

#[tokio::test]
async fn success_and_unlocked_requests_pass_through_unchanged() {
    let locker = Locker::new(MemoryBackend::new());
    let svc = ServiceBuilder::new()
        .layer(ErrorResponseLayer::default())
        .layer(LockLayer::new(locker, by_path))
        .service(service_fn(ok_handler));
    for path in ["/orders/2", "/free"] {
        let (status, body) = text(svc.clone().oneshot(get(path)).await.unwrap()).await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "done"), "{path}");
    }
}

#[tokio::test]
async fn a_timeout_is_409_by_default_and_configurable() {
    let locker = Locker::new(MemoryBackend::new());
    let _held = locker.try_acquire("orders/3").await.unwrap().unwrap();
    let lock = LockLayer::new(locker, by_path).wait(Duration::from_millis(50));
    let default = ServiceBuilder::new()
        .layer(ErrorResponseLayer::default())
        .layer(lock.clone())
        .service(service_fn(ok_handler));
    let response = default.oneshot(get("/orders/3")).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let custom = ServiceBuilder::new()
        .layer(ErrorResponseLayer::new(
            StatusMap::default().timeout(StatusCode::TOO_MANY_REQUESTS),
        ))
        .layer(lock)
        .service(service_fn(ok_handler));
    let (status, body) = text(custom.oneshot(get("/orders/3")).await.unwrap()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(body.contains("timed out"), "{body}");
}

/// A backend whose server is down.
#[derive(Debug)]
struct Down;

fn down() -> Error {
    Error::new(ErrorKind::Unavailable, "down", "connection refused")
}

#[leasehold_core::async_trait]
impl leasehold_core::LockBackend for Down {
    leasehold_core::refuse_primitives!("a test backend");

    fn capabilities(&self) -> leasehold_core::Capabilities {
        leasehold_core::Capabilities::new(
            "down",
            leasehold_core::SafetyClass::Efficiency,
            leasehold_core::FencingKind::None,
        )
    }
    async fn try_lock(
        &self,
        _req: leasehold_core::LockRequest<'_>,
    ) -> Result<Option<leasehold_core::Grant>, Error> {
        Err(down())
    }
    async fn wait_lock(
        &self,
        _req: leasehold_core::LockRequest<'_>,
        _d: tokio::time::Instant,
    ) -> Result<leasehold_core::Waited, Error> {
        Err(Error::new(ErrorKind::Unsupported, "down", "no native wait"))
    }
    async fn release(&self, _held: leasehold_core::Held<'_>) -> Result<bool, Error> {
        Err(down())
    }
    async fn extend(
        &self,
        _req: leasehold_core::ExtendRequest<'_>,
    ) -> Result<Option<leasehold_core::Validity>, Error> {
        Err(down())
    }
    async fn extend_many(
        &self,
        reqs: &[leasehold_core::ExtendRequest<'_>],
    ) -> Vec<Result<Option<leasehold_core::Validity>, leasehold_core::Error>> {
        leasehold_core::extend_each(self, reqs).await
    }

    async fn inspect(
        &self,
        _key: &leasehold_core::LockKey,
    ) -> Result<Option<leasehold_core::HolderInfo>, Error> {
        Err(down())
    }
}

#[tokio::test]
async fn an_unavailable_backend_is_503_and_configurable() {
    let locker = Locker::new(Down);
    for (map, expected) in [
        (StatusMap::default(), StatusCode::SERVICE_UNAVAILABLE),
        (
            StatusMap::default().unavailable(StatusCode::BAD_GATEWAY),
            StatusCode::BAD_GATEWAY,
        ),
    ] {
        let svc = ServiceBuilder::new()
            .layer(ErrorResponseLayer::new(map))
            .layer(LockLayer::new(locker.clone(), by_path))
            .service(service_fn(ok_handler));
        let (status, body) = text(svc.oneshot(get("/orders/4")).await.unwrap()).await;
        assert_eq!(status, expected);
        assert!(body.contains("unavailable"), "{body}");
    }
}

#[tokio::test]
async fn a_lease_lost_mid_request_is_503_and_an_invalid_key_500() {
    let locker = short_lived(Duration::from_millis(100));
    let slow = service_fn(|_req: Req| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Ok::<_, Infallible>(Response::new(String::new()))
    });
    let svc = ServiceBuilder::new()
        .layer(ErrorResponseLayer::default())
        .layer(LockLayer::new(locker.clone(), by_path))
        .service(slow);
    let started = std::time::Instant::now();
    let response = svc.oneshot(get("/orders/5")).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() < Duration::from_secs(2));

    let svc = ServiceBuilder::new()
        .layer(ErrorResponseLayer::default())
        .layer(LockLayer::new(locker, |_: &Req| Some(String::new())))
        .service(service_fn(ok_handler));
    let response = svc.oneshot(get("/x")).await.unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn the_handler_s_own_error_passes_through() {
    let locker = Locker::new(MemoryBackend::new());
    let svc = ServiceBuilder::new()
        .layer(ErrorResponseLayer::default())
        .layer(LockLayer::new(locker, by_path))
        .service(service_fn(|_req: Req| async {
            Err::<Response<String>, _>(std::io::Error::other("disk full"))
        }));
    let err = svc.oneshot(get("/orders/6")).await.unwrap_err();
    assert_eq!(err.to_string(), "disk full");
}

#[test]
fn status_of_each_error_under_the_default_map() {
    let key = leasehold_core::LockKey::new("k").unwrap();
    let contended: LockError<Infallible, ()> = LockError::Contended { key: key.clone() };
    assert_eq!(contended.status(), Some(StatusCode::CONFLICT));
    let unavailable: LockError<Infallible, ()> = LockError::Unavailable(down());
    assert_eq!(unavailable.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
    let service: LockError<std::io::Error, ()> = LockError::Service(std::io::Error::other("x"));
    assert_eq!(service.status(), None);
    let map = StatusMap::default()
        .contended(StatusCode::LOCKED)
        .lease_lost(StatusCode::GONE)
        .lock_error(StatusCode::BAD_REQUEST);
    assert_eq!(map.status(&contended), Some(StatusCode::LOCKED));
    let lost: LockError<Infallible, ()> = LockError::LeaseLost {
        key,
        reason: LossReason::Expired,
        completed: None,
    };
    assert_eq!(map.status(&lost), Some(StatusCode::GONE));
}

// ---- holding the lease while the body streams ----

type Streamed = Response<Channel<Bytes>>;

/// A handler whose response body is fed, frame by frame, through the returned sender.
fn streaming() -> (
    impl tower::Service<Req, Response = Streamed, Error = Infallible, Future: Send> + Clone,
    tokio::sync::mpsc::UnboundedReceiver<http_body_util::channel::Sender<Bytes>>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let svc = service_fn(move |_req: Req| {
        let tx = tx.clone();
        async move {
            let (sender, body) = Channel::<Bytes>::new(4);
            tx.send(sender).unwrap();
            Ok::<_, Infallible>(Response::new(body))
        }
    });
    (svc, rx)
}

async fn next_data<B>(body: &mut B) -> Option<Bytes>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let frame = body.frame().await?.unwrap();
    Some(frame.into_data().unwrap())
}

#[tokio::test]
async fn hold_body_keeps_the_lease_until_the_body_has_streamed() {
    let locker = Locker::new(MemoryBackend::new());
    let (inner, mut senders) = streaming();
    let svc = LockLayer::new(locker.clone(), by_path)
        .hold_body()
        .layer(inner);
    let response = svc.oneshot(get("/reports/1")).await.unwrap();
    let mut sender = senders.recv().await.unwrap();
    let mut body: LeaseBody<Channel<Bytes>> = response.into_body();
    assert_eq!(body.lease().unwrap().key().as_str(), "reports/1");

    sender
        .send_data(Bytes::from_static(b"part 1"))
        .await
        .unwrap();
    assert_eq!(next_data(&mut body).await.unwrap(), "part 1");
    // Mid-stream: the response head is long gone, the lock is still held.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(locker.try_acquire("reports/1").await.unwrap().is_none());
    assert!(body.lease().is_some());

    sender
        .send_data(Bytes::from_static(b"part 2"))
        .await
        .unwrap();
    drop(sender);
    assert_eq!(next_data(&mut body).await.unwrap(), "part 2");
    assert!(body.frame().await.is_none(), "the body has ended");
    assert!(body.lease().is_none(), "the body let go of the lease");
    assert!(eventually_free(&locker, "reports/1").await);
}

#[tokio::test]
async fn hold_body_releases_when_the_body_is_dropped_mid_stream() {
    let locker = Locker::new(MemoryBackend::new());
    let (inner, mut senders) = streaming();
    let svc = LockLayer::new(locker.clone(), by_path)
        .hold_body()
        .layer(inner);
    let response = svc.oneshot(get("/reports/2")).await.unwrap();
    let mut sender = senders.recv().await.unwrap();
    let mut body = response.into_body();
    sender
        .send_data(Bytes::from_static(b"part 1"))
        .await
        .unwrap();
    assert_eq!(next_data(&mut body).await.unwrap(), "part 1");
    assert!(locker.try_acquire("reports/2").await.unwrap().is_none());
    // The client goes away mid-stream.
    drop(body);
    assert!(eventually_free(&locker, "reports/2").await);
}

#[tokio::test]
async fn without_hold_body_the_lease_ends_with_the_response_head() {
    let locker = Locker::new(MemoryBackend::new());
    let (inner, mut senders) = streaming();
    let svc = LockLayer::new(locker.clone(), by_path).layer(inner);
    let response = svc.oneshot(get("/reports/3")).await.unwrap();
    let _sender = senders.recv().await.unwrap();
    let _body = response.into_body();
    // Still streaming, but the lease is already gone.
    assert!(eventually_free(&locker, "reports/3").await);
}

#[tokio::test]
async fn a_lease_lost_mid_stream_breaks_the_body_by_default() {
    let locker = short_lived(Duration::from_millis(150));
    let (inner, mut senders) = streaming();
    let svc = LockLayer::new(locker.clone(), by_path)
        .hold_body()
        .layer(inner);
    let response = svc.oneshot(get("/reports/4")).await.unwrap();
    let mut sender = senders.recv().await.unwrap();
    let mut body = response.into_body();
    sender
        .send_data(Bytes::from_static(b"part 1"))
        .await
        .unwrap();
    assert_eq!(next_data(&mut body).await.unwrap(), "part 1");
    // The producer stalls past the lease: the body fails instead of completing.
    let err = body.frame().await.unwrap().unwrap_err();
    let lost = err.downcast_ref::<LeaseLostError>().unwrap();
    assert_eq!(lost.key.as_str(), "reports/4");
    assert_eq!(lost.reason, LossReason::Expired);
    assert!(body.is_end_stream());
    assert!(body.frame().await.is_none());
    assert!(body.lease().is_none());
    drop(sender);
}

#[tokio::test]
async fn with_on_lost_finish_a_body_streams_to_the_end_after_the_loss() {
    let locker = short_lived(Duration::from_millis(100));
    let (inner, mut senders) = streaming();
    let svc = LockLayer::new(locker, by_path)
        .on_lost(OnLost::Finish)
        .hold_body()
        .layer(inner);
    let response = svc.oneshot(get("/reports/5")).await.unwrap();
    let mut sender = senders.recv().await.unwrap();
    let mut body = response.into_body();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(body.lease().unwrap().is_lost());
    sender.send_data(Bytes::from_static(b"late")).await.unwrap();
    drop(sender);
    assert_eq!(next_data(&mut body).await.unwrap(), "late");
    assert!(body.frame().await.is_none());
}

#[tokio::test]
async fn error_responses_work_with_a_lease_body() {
    let locker = Locker::new(MemoryBackend::new());
    let _held = locker.try_acquire("reports/6").await.unwrap().unwrap();
    let svc = ServiceBuilder::new()
        .layer(ErrorResponseLayer::default())
        .layer(LockLayer::new(locker, by_path).hold_body())
        .service(service_fn(|_req: Req| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"x"))))
        }));
    let response: Response<LeaseBody<Full<Bytes>>> = svc.oneshot(get("/reports/6")).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert!(body.starts_with(b"the resource is locked"));
}
