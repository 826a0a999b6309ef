//! The metrics of leasehold-core and of LockLayer, read back through a debugging recorder.
#![cfg(feature = "metrics")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response};
use leasehold_core::metrics::{
    ACQUIRE_ATTEMPTS, ACQUIRE_SECONDS, ACQUIRE_TIMEOUTS, CONTENDED, LEASES_HELD, LEASES_LOST,
    RENEWAL_FAILURES, REQUESTS,
};
use leasehold_core::{
    Capabilities, Error, ErrorKind, ExtendRequest, Grant, Held, HolderInfo, LockBackend, LockKey,
    LockOptions, LockRequest, Locker, MemoryBackend, Renewal, Validity, Waited, async_trait,
};
use leasehold_tower::{ErrorResponseLayer, KeyExtractor, LockLayer};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower::{ServiceBuilder, ServiceExt, service_fn};

/// Every metric recorded so far, as `(name, sorted labels, value)`. Taking a snapshot of the
/// debugging recorder resets its values, so each snapshot is added to the totals.
struct Snapshot(Vec<(String, Labels, DebugValue)>);

type Labels = Vec<(String, String)>;

impl Snapshot {
    fn new() -> Self {
        Self(Vec::new())
    }

    fn take(&mut self, s: &Snapshotter) -> &Self {
        for (ck, _, _, v) in s.snapshot().into_vec() {
            let key = ck.key();
            let mut labels: Vec<_> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let name = key.name().to_owned();
            let Some((_, _, total)) = self
                .0
                .iter_mut()
                .find(|(n, l, _)| *n == name && *l == labels)
            else {
                self.0.push((name, labels, v));
                continue;
            };
            match (total, v) {
                (DebugValue::Counter(t), DebugValue::Counter(n)) => *t += n,
                (DebugValue::Gauge(t), DebugValue::Gauge(g)) => {
                    *t = (t.into_inner() + g.into_inner()).into()
                }
                (DebugValue::Histogram(t), DebugValue::Histogram(h)) => t.extend(h),
                (t, v) => panic!("{name}: {t:?} then {v:?}"),
            }
        }
        self
    }

    fn find(&self, name: &str, labels: &[(&str, &str)]) -> Option<&DebugValue> {
        let mut want: Vec<_> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        want.sort();
        self.0
            .iter()
            .find(|(n, l, _)| n == name && *l == want)
            .map(|(_, _, v)| v)
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        match self.find(name, labels) {
            Some(DebugValue::Counter(n)) => *n,
            None => 0,
            Some(other) => panic!("{name} is not a counter: {other:?}"),
        }
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match self.find(name, labels) {
            Some(DebugValue::Gauge(g)) => g.into_inner(),
            other => panic!("{name} {labels:?} is not a gauge: {other:?}"),
        }
    }

    fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        match self.find(name, labels) {
            Some(DebugValue::Histogram(v)) => v.iter().map(|x| x.into_inner()).collect(),
            None => Vec::new(),
            Some(other) => panic!("{name} is not a histogram: {other:?}"),
        }
    }
}

const MEM: (&str, &str) = ("backend", "memory");

#[tokio::test]
async fn acquisitions_contention_timeouts_and_leases_held_are_counted_per_backend() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let mut totals = Snapshot::new();

    let locker = Locker::new(MemoryBackend::new());
    let a = locker.try_acquire("m/1").await.unwrap().unwrap();
    let b = locker.try_acquire("m/2").await.unwrap().unwrap();
    assert!(locker.try_acquire("m/1").await.unwrap().is_none());
    let err = locker
        .acquire("m/2", Duration::from_millis(60))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);

    let snap = totals.take(&snapshotter);
    assert_eq!(snap.gauge(LEASES_HELD, &[MEM]), 2.0);
    // 2 grants + 1 contended try + at least 2 contended retries while waiting.
    let attempts = snap.counter(ACQUIRE_ATTEMPTS, &[MEM]);
    let contended = snap.counter(CONTENDED, &[MEM]);
    assert!(attempts >= 5, "{attempts}");
    assert_eq!(
        attempts - contended,
        2,
        "every attempt but the grants was contended"
    );
    assert_eq!(snap.counter(ACQUIRE_TIMEOUTS, &[MEM]), 1);
    let acquired = snap.histogram(ACQUIRE_SECONDS, &[MEM, ("outcome", "acquired")]);
    assert_eq!(acquired.len(), 2);
    assert_eq!(
        snap.histogram(ACQUIRE_SECONDS, &[MEM, ("outcome", "contended")])
            .len(),
        1
    );
    let timeout = snap.histogram(ACQUIRE_SECONDS, &[MEM, ("outcome", "timeout")]);
    assert_eq!(timeout.len(), 1);
    assert!(timeout[0] >= 0.05, "{timeout:?}");

    // Release one, drop the other: the gauge goes back to zero; neither is a loss.
    assert!(a.release().await.unwrap());
    drop(b);
    let snap = totals.take(&snapshotter);
    assert_eq!(snap.gauge(LEASES_HELD, &[MEM]), 0.0);
    assert_eq!(snap.counter(LEASES_LOST, &[MEM, ("reason", "expired")]), 0);
}

#[tokio::test]
async fn a_lease_past_its_deadline_counts_as_lost_once() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let mut totals = Snapshot::new();

    let locker = Locker::new(MemoryBackend::new())
        .with_options(
            LockOptions::default()
                .with_ttl(Duration::from_millis(50))
                .with_renewal(Renewal::Off),
        )
        .unwrap();
    let lease = locker.try_acquire("m/3").await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_millis(80)).await;
    assert!(lease.is_lost());
    let _ = lease.release().await;
    drop(lease);
    let snap = totals.take(&snapshotter);
    assert_eq!(snap.counter(LEASES_LOST, &[MEM, ("reason", "expired")]), 1);
    assert_eq!(snap.gauge(LEASES_HELD, &[MEM]), 0.0);
}

/// The memory backend, except that every renewal fails as if the server were unreachable.
#[derive(Debug, Default)]
struct NoRenewal(MemoryBackend);

#[async_trait]
impl LockBackend for NoRenewal {
    leasehold_core::refuse_primitives!("a test backend");

    fn capabilities(&self) -> Capabilities {
        self.0
            .capabilities()
            .with_name("no-renewal")
            .without_primitives()
    }
    async fn try_lock(&self, req: LockRequest<'_>) -> Result<Option<Grant>, Error> {
        self.0.try_lock(req).await
    }
    async fn wait_lock(
        &self,
        req: LockRequest<'_>,
        d: tokio::time::Instant,
    ) -> Result<Waited, Error> {
        self.0.wait_lock(req, d).await
    }
    async fn release(&self, held: Held<'_>) -> Result<bool, Error> {
        self.0.release(held).await
    }
    async fn extend(&self, _req: ExtendRequest<'_>) -> Result<Option<Validity>, Error> {
        Err(Error::new(
            ErrorKind::Unavailable,
            "no-renewal",
            "connection refused",
        ))
    }
    async fn extend_many(
        &self,
        reqs: &[leasehold_core::ExtendRequest<'_>],
    ) -> Vec<leasehold_core::Extended> {
        leasehold_core::extend_each(self, reqs).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<HolderInfo>, Error> {
        self.0.inspect(key).await
    }
}

#[tokio::test]
async fn failed_renewals_and_the_loss_they_cause_are_counted() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let mut totals = Snapshot::new();

    let locker = Locker::new(NoRenewal::default())
        .with_options(
            LockOptions::default()
                .with_ttl(Duration::from_millis(200))
                .with_renewal(Renewal::Every(Duration::from_millis(40))),
        )
        .unwrap();
    let lease = locker.try_acquire("m/4").await.unwrap().unwrap();
    let reason = lease.lost().await;
    assert!(
        matches!(
            reason,
            leasehold_core::LossReason::RenewalFailed(_) | leasehold_core::LossReason::Expired
        ),
        "{reason:?}"
    );
    // The watchdog's last failed try records the loss as `renewal_failed` if it runs before
    // the deadline is seen to pass; otherwise the loss is counted as `expired` at the drop.
    // Either way, once.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(lease);
    let snap = totals.take(&snapshotter);
    let backend = ("backend", "no-renewal");
    let failures = snap.counter(RENEWAL_FAILURES, &[backend]);
    assert!(failures >= 2, "{failures}");
    let lost = |reason| snap.counter(LEASES_LOST, &[backend, ("reason", reason)]);
    assert_eq!(lost("renewal_failed") + lost("expired"), 1);
    assert_eq!(lost("not_held") + lost("backend"), 0);
}

type Req = Request<String>;

/// Locks the path; derives the route from the method for `/derived/...` paths.
#[derive(Clone)]
struct ByPath;

impl KeyExtractor<Req> for ByPath {
    fn extract(&self, req: &Req) -> Option<String> {
        match req.uri().path() {
            "/free" => None,
            p => Some(p.to_owned()),
        }
    }
    fn route(&self, req: &Req) -> Option<String> {
        req.uri()
            .path()
            .starts_with("/derived/")
            .then(|| format!("{} /derived/{{id}}", req.method()))
    }
}

fn get(path: &str) -> Req {
    Request::builder().uri(path).body(String::new()).unwrap()
}

#[tokio::test]
async fn lock_layer_counts_request_outcomes_per_route() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);
    let mut totals = Snapshot::new();

    let locker = Locker::new(MemoryBackend::new());
    let svc = ServiceBuilder::new()
        .layer(ErrorResponseLayer::default())
        .layer(LockLayer::new(locker.clone(), ByPath).route("orders"))
        .service(service_fn(|_req: Req| async {
            Ok::<_, Infallible>(Response::new(String::new()))
        }));
    for path in ["/o/1", "/o/2", "/free", "/derived/7"] {
        assert!(
            svc.clone()
                .oneshot(get(path))
                .await
                .unwrap()
                .status()
                .is_success()
        );
    }
    let held = locker
        .acquire("/o/1", Duration::from_secs(1))
        .await
        .unwrap();
    let response = svc.clone().oneshot(get("/o/1")).await.unwrap();
    assert_eq!(response.status(), http::StatusCode::CONFLICT);
    drop(held);

    let snap = totals.take(&snapshotter);
    let orders = ("route", "orders");
    assert_eq!(snap.counter(REQUESTS, &[orders, ("outcome", "ok")]), 2);
    assert_eq!(
        snap.counter(REQUESTS, &[orders, ("outcome", "unlocked")]),
        1
    );
    assert_eq!(
        snap.counter(REQUESTS, &[orders, ("outcome", "contended")]),
        1
    );
    assert_eq!(
        snap.counter(
            REQUESTS,
            &[("route", "GET /derived/{id}"), ("outcome", "ok")]
        ),
        1
    );
    // An unnamed layer still counts, under the `unnamed` route.
    let plain = LockLayer::new(locker, |_: &Req| Some("k".to_owned()));
    let svc = ServiceBuilder::new()
        .layer(plain)
        .service(service_fn(|_req: Req| async { Ok::<_, Infallible>(()) }));
    svc.oneshot(get("/")).await.unwrap();
    let snap = totals.take(&snapshotter);
    assert_eq!(
        snap.counter(REQUESTS, &[("route", "unnamed"), ("outcome", "ok")]),
        1
    );
}
