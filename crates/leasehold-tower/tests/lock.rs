//! LockLayer against tower-test's mock service and the in-memory backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use http::Request;
use leasehold_core::{
    Capabilities, Error, ErrorKind, ExtendRequest, FencingKind, Grant, Held, HolderInfo, LeaseInfo,
    LockBackend, LockKey, LockOptions, LockRequest, Locker, LossReason, MemoryBackend, Renewal,
    SafetyClass, Validity, Waited, async_trait,
};
use leasehold_tower::{LockError, LockLayer, OnLost};
use tokio::time::Instant as TokioInstant;
use tower::{Layer, ServiceExt, service_fn};
use tower_test::mock;

type Req = Request<&'static str>;

/// Locks the request body as the key; `free` passes through unlocked.
fn by_body(req: &Req) -> Option<String> {
    match *req.body() {
        "free" => None,
        key => Some(key.to_owned()),
    }
}

fn short_lived(ttl: Duration) -> Result<Locker, Error> {
    Locker::new(MemoryBackend::new()).with_options(
        LockOptions::default()
            .with_ttl(ttl)
            .with_renewal(Renewal::Off),
    )
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

#[tokio::test]
async fn try_mode_holds_the_lease_until_the_response_and_passes_it_to_the_handler() {
    let locker = Locker::new(MemoryBackend::new());
    let layer = LockLayer::new(locker.clone(), by_body);
    let (mut svc, mut handle) = mock::spawn_layer::<Req, &'static str, _>(layer);

    tokio_test::assert_ready_ok!(svc.poll_ready());
    let call = tokio::spawn(svc.call(Request::new("orders/1")));
    let (req, send) = handle.next_request().await.unwrap();
    let info = req.extensions().get::<LeaseInfo>().cloned().unwrap();
    assert_eq!(info.key.as_str(), "orders/1");
    assert!(info.fencing.is_some());
    assert!(!info.lost.is_lost());
    // Held while the request runs.
    assert!(locker.try_acquire("orders/1").await.unwrap().is_none());
    send.send_response("done");
    assert_eq!(call.await.unwrap().unwrap(), "done");
    // Released (in the background) once the response is ready.
    assert!(eventually_free(&locker, "orders/1").await);
    assert!(info.lost.is_lost());
}

#[tokio::test]
async fn try_mode_fails_fast_on_contention_without_calling_the_service() {
    let locker = Locker::new(MemoryBackend::new());
    let _held = locker.try_acquire("orders/2").await.unwrap().unwrap();
    let (mut svc, mut handle) =
        mock::spawn_layer::<Req, &'static str, _>(LockLayer::new(locker, by_body));
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let err = svc.call(Request::new("orders/2")).await.unwrap_err();
    match err {
        LockError::Contended { key } => assert_eq!(key.as_str(), "orders/2"),
        other => panic!("expected Contended, got {other:?}"),
    }
    let next = tokio::time::timeout(Duration::from_millis(50), handle.next_request()).await;
    assert!(next.is_err(), "the inner service must not be called");
}

#[tokio::test]
async fn requests_without_a_key_pass_through_unlocked() {
    let locker = Locker::new(MemoryBackend::new());
    let (mut svc, mut handle) =
        mock::spawn_layer::<Req, &'static str, _>(LockLayer::new(locker, by_body));
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let call = tokio::spawn(svc.call(Request::new("free")));
    let (req, send) = handle.next_request().await.unwrap();
    assert!(req.extensions().get::<LeaseInfo>().is_none());
    send.send_response("ok");
    assert_eq!(call.await.unwrap().unwrap(), "ok");
}

#[tokio::test]
async fn poll_ready_delegates_to_the_inner_service() {
    let locker = Locker::new(MemoryBackend::new());
    let (mut svc, mut handle) =
        mock::spawn_layer::<Req, &'static str, _>(LockLayer::new(locker, by_body));
    handle.allow(0);
    tokio_test::assert_pending!(svc.poll_ready());
    handle.allow(1);
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let call = tokio::spawn(svc.call(Request::new("k")));
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(*req.body(), "k");
    send.send_response("ok");
    assert_eq!(call.await.unwrap().unwrap(), "ok");
    // The readied instance was used up by the call; the clone left behind is not ready.
    tokio_test::assert_pending!(svc.poll_ready());
}

#[tokio::test]
async fn wait_mode_waits_for_the_holder_within_the_budget() {
    let locker = Locker::new(MemoryBackend::new());
    let held = locker.try_acquire("orders/3").await.unwrap().unwrap();
    let layer = LockLayer::new(locker.clone(), by_body).wait(Duration::from_secs(2));
    let (mut svc, mut handle) = mock::spawn_layer::<Req, &'static str, _>(layer);
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let started = Instant::now();
    let call = tokio::spawn(svc.call(Request::new("orders/3")));
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        drop(held.release().await);
    });
    let (req, send) = handle.next_request().await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(140));
    assert!(req.extensions().get::<LeaseInfo>().is_some());
    send.send_response("ok");
    assert_eq!(call.await.unwrap().unwrap(), "ok");
}

#[tokio::test]
async fn wait_mode_times_out_with_a_typed_error() {
    let locker = Locker::new(MemoryBackend::new());
    let _held = locker.try_acquire("orders/4").await.unwrap().unwrap();
    let layer = LockLayer::new(locker, by_body).wait(Duration::from_millis(100));
    let (mut svc, _handle) = mock::spawn_layer::<Req, &'static str, _>(layer);
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let started = Instant::now();
    match svc.call(Request::new("orders/4")).await.unwrap_err() {
        LockError::Timeout { key, source } => {
            assert_eq!(key.as_str(), "orders/4");
            assert_eq!(source.kind(), ErrorKind::Timeout);
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(90));
}

#[tokio::test]
async fn an_invalid_key_is_a_lock_error() {
    let locker = Locker::new(MemoryBackend::new());
    let layer = LockLayer::new(locker, |_: &Req| Some(String::new()));
    let (mut svc, _handle) = mock::spawn_layer::<Req, &'static str, _>(layer);
    tokio_test::assert_ready_ok!(svc.poll_ready());
    match svc.call(Request::new("x")).await.unwrap_err() {
        LockError::Lock(e) => assert_eq!(e.kind(), ErrorKind::InvalidKey),
        other => panic!("expected Lock(InvalidKey), got {other:?}"),
    }
}

/// Sets its flag when dropped: tells whether the inner future was cancelled.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_lease_lost_mid_request_aborts_the_inner_future_by_default() {
    let locker = short_lived(Duration::from_millis(200)).unwrap();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&dropped);
    let inner = service_fn(move |_req: Req| {
        let guard = DropFlag(Arc::clone(&flag));
        async move {
            tokio::time::sleep(Duration::from_secs(10)).await;
            drop(guard);
            Ok::<_, std::convert::Infallible>("finished")
        }
    });
    let svc = LockLayer::new(locker.clone(), by_body).layer(inner);
    let started = Instant::now();
    let err = svc.oneshot(Request::new("orders/5")).await.unwrap_err();
    let elapsed = started.elapsed();
    match err {
        LockError::LeaseLost {
            key,
            reason,
            completed,
        } => {
            assert_eq!(key.as_str(), "orders/5");
            assert_eq!(reason, LossReason::Expired);
            assert!(completed.is_none());
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert!(
        dropped.load(Ordering::SeqCst),
        "the inner future was not dropped"
    );
    assert!(elapsed >= Duration::from_millis(150), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
}

#[tokio::test]
async fn a_lease_lost_mid_request_can_let_the_work_finish_and_says_so() {
    let locker = short_lived(Duration::from_millis(200)).unwrap();
    let inner = service_fn(|_req: Req| async {
        tokio::time::sleep(Duration::from_millis(400)).await;
        Ok::<_, std::convert::Infallible>("finished late")
    });
    let svc = LockLayer::new(locker, by_body)
        .on_lost(OnLost::Finish)
        .layer(inner);
    let started = Instant::now();
    let err = svc.oneshot(Request::new("orders/6")).await.unwrap_err();
    assert!(started.elapsed() >= Duration::from_millis(390));
    match err {
        LockError::LeaseLost {
            reason, completed, ..
        } => {
            assert_eq!(reason, LossReason::Expired);
            let out = completed.and_then(|c| c.take()).unwrap();
            assert_eq!(out.unwrap(), "finished late");
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
}

#[tokio::test]
async fn a_request_that_finishes_in_time_succeeds_with_a_short_lease() {
    let locker = short_lived(Duration::from_millis(300)).unwrap();
    let inner = service_fn(|_req: Req| async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        Ok::<_, std::convert::Infallible>("quick")
    });
    let svc = LockLayer::new(locker, by_body).layer(inner);
    assert_eq!(
        svc.oneshot(Request::new("orders/7")).await.unwrap(),
        "quick"
    );
}

/// A backend whose server is unreachable: every call fails as a real driver's would.
#[derive(Debug)]
struct Unreachable;

fn down() -> Error {
    Error::new(ErrorKind::Unavailable, "unreachable", "connection refused")
}

#[async_trait]
impl LockBackend for Unreachable {
    leasehold_core::refuse_primitives!("a test backend");

    fn capabilities(&self) -> Capabilities {
        Capabilities::new("unreachable", SafetyClass::Efficiency, FencingKind::None)
    }
    async fn try_lock(&self, _req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        Err(down())
    }
    async fn wait_lock(&self, _req: LockRequest<'_>, _d: TokioInstant) -> Result<Waited, Error> {
        Err(Error::new(
            ErrorKind::Unsupported,
            "unreachable",
            "no native wait",
        ))
    }
    async fn release(&self, _held: Held<'_>) -> Result<bool, Error> {
        Err(down())
    }
    async fn extend(&self, _req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        Err(down())
    }
    async fn extend_many(
        &self,
        reqs: &[leasehold_core::ExtendRequest<'_>],
    ) -> Vec<Result<Option<leasehold_core::Validity>, leasehold_core::Error>> {
        leasehold_core::extend_each(self, reqs).await
    }

    async fn inspect(&self, _key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        Err(down())
    }
}

#[tokio::test]
async fn an_unreachable_backend_is_unavailable_in_both_modes() {
    let locker = Locker::new(Unreachable);
    let (mut svc, _h) =
        mock::spawn_layer::<Req, &'static str, _>(LockLayer::new(locker.clone(), by_body));
    tokio_test::assert_ready_ok!(svc.poll_ready());
    match svc.call(Request::new("k")).await.unwrap_err() {
        LockError::Unavailable(e) => assert_eq!(e.kind(), ErrorKind::Unavailable),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let layer = LockLayer::new(locker, by_body).wait(Duration::from_millis(100));
    let (mut svc, _h) = mock::spawn_layer::<Req, &'static str, _>(layer);
    tokio_test::assert_ready_ok!(svc.poll_ready());
    match svc.call(Request::new("k")).await.unwrap_err() {
        LockError::Unavailable(e) => assert_eq!(e.kind(), ErrorKind::Timeout),
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[test]
fn errors_are_send_sync_and_box_into_tower_errors() {
    fn boxable<E: Into<tower::BoxError>>() {}
    boxable::<LockError<std::io::Error, Request<&'static str>>>();
    boxable::<leasehold_tower::FenceError<std::io::Error>>();
}

// ---- a lease lost mid-request, with the inner service a tower-test mock ----

#[tokio::test]
async fn mock_a_lease_lost_while_the_mock_has_not_answered_aborts_the_call() {
    let locker = short_lived(Duration::from_millis(150)).unwrap();
    let (mut svc, mut handle) =
        mock::spawn_layer::<Req, &'static str, _>(LockLayer::new(locker.clone(), by_body));
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let call = tokio::spawn(svc.call(Request::new("orders/8")));
    let (req, send) = handle.next_request().await.unwrap();
    let info = req.extensions().get::<LeaseInfo>().cloned().unwrap();
    // The mock never answers in time: the layer gives up when the lease is lost.
    match call.await.unwrap().unwrap_err() {
        LockError::LeaseLost {
            key,
            reason,
            completed,
        } => {
            assert_eq!(key.as_str(), "orders/8");
            assert_eq!(reason, LossReason::Expired);
            assert!(completed.is_none());
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    assert!(info.lost.is_lost());
    // The aborted call no longer waits for the answer; a late one goes nowhere.
    send.send_response("too late");
    assert!(eventually_free(&locker, "orders/8").await);
}

#[tokio::test]
async fn mock_finish_mode_returns_the_late_answer_inside_lease_lost() {
    let locker = short_lived(Duration::from_millis(100)).unwrap();
    let layer = LockLayer::new(locker, by_body).on_lost(OnLost::Finish);
    let (mut svc, mut handle) = mock::spawn_layer::<Req, &'static str, _>(layer);
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let call = tokio::spawn(svc.call(Request::new("orders/9")));
    let (req, send) = handle.next_request().await.unwrap();
    let info = req.extensions().get::<LeaseInfo>().cloned().unwrap();
    let reason = info.lost.clone().wait().await;
    assert_eq!(reason, LossReason::Expired);
    assert!(!call.is_finished(), "Finish waits for the inner service");
    send.send_response("finished late");
    match call.await.unwrap().unwrap_err() {
        LockError::LeaseLost { completed, .. } => {
            let out = completed.and_then(|c| c.take()).unwrap();
            assert_eq!(out.unwrap(), "finished late");
        }
        other => panic!("expected LeaseLost, got {other:?}"),
    }
}

#[tokio::test]
async fn mock_wait_mode_then_a_lease_lost_mid_request() {
    let locker = short_lived(Duration::from_millis(150)).unwrap();
    let held = locker.try_acquire("orders/10").await.unwrap().unwrap();
    let layer = LockLayer::new(locker.clone(), by_body).wait(Duration::from_secs(2));
    let (mut svc, mut handle) = mock::spawn_layer::<Req, &'static str, _>(layer);
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let call = tokio::spawn(svc.call(Request::new("orders/10")));
    tokio::time::sleep(Duration::from_millis(30)).await;
    drop(held.release().await);
    let (_req, _send) = handle.next_request().await.unwrap();
    match call.await.unwrap().unwrap_err() {
        LockError::LeaseLost { reason, .. } => assert_eq!(reason, LossReason::Expired),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
}

#[tokio::test]
async fn mock_the_inner_service_s_error_is_a_service_error_and_releases() {
    let locker = Locker::new(MemoryBackend::new());
    let (mut svc, mut handle) =
        mock::spawn_layer::<Req, &'static str, _>(LockLayer::new(locker.clone(), by_body));
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let call = tokio::spawn(svc.call(Request::new("orders/11")));
    let (_req, send) = handle.next_request().await.unwrap();
    send.send_error(std::io::Error::other("boom"));
    match call.await.unwrap().unwrap_err() {
        LockError::Service(e) => assert_eq!(e.to_string(), "boom"),
        other => panic!("expected Service, got {other:?}"),
    }
    assert!(eventually_free(&locker, "orders/11").await);
}

#[tokio::test]
async fn mock_hold_body_mode_keeps_the_lease_until_the_body_is_dropped() {
    type Resp = http::Response<String>;
    let locker = Locker::new(MemoryBackend::new());
    let layer = LockLayer::new(locker.clone(), by_body).hold_body();
    let (mut svc, mut handle) = mock::spawn_layer::<Req, Resp, _>(layer);
    tokio_test::assert_ready_ok!(svc.poll_ready());
    let call = tokio::spawn(svc.call(Request::new("orders/12")));
    let (_req, send) = handle.next_request().await.unwrap();
    send.send_response(http::Response::new("body".to_owned()));
    let response = call.await.unwrap().unwrap();
    let body = response.into_body();
    assert_eq!(body.get_ref(), "body");
    assert!(body.lease().is_some());
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(locker.try_acquire("orders/12").await.unwrap().is_none());
    drop(body);
    assert!(eventually_free(&locker, "orders/12").await);
}
