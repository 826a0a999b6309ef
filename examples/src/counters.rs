//! An axum service whose counters are incremented under a lock, and written to a store that
//! rejects stale fencing tokens: the two layers of `leasehold::tower` in one process.
//!
//! - `POST /counters/{name}/increment` runs under a lease of `counters/{name}`
//!   ([`LockLayer`], waiting up to the configured budget), reads the counter, and writes the
//!   new value to the [`Store`] with the lease's fencing token. The store sits behind a
//!   [`FenceLayer`]: a write carrying a token lower than one already accepted for that counter
//!   is refused (409), so a holder that lost its lease while paused cannot overwrite the work of
//!   the next one. `?work_ms=N` makes the handler work N ms under the lock (to see contention
//!   and lost leases). Lock failures are answered by [`ErrorResponseLayer`]: 409 when the lock
//!   stays held past the wait budget, 503 when the backend is unreachable or the lease is lost.
//! - `GET /counters/{name}` reads a counter (no lock).
//! - `GET /metrics` renders every metric in the Prometheus text format.
//!
//! The backend is whatever [`load_config`] finds: nothing but configuration changes between
//! the in-memory default, Redis, PostgreSQL or etcd.

use std::collections::HashMap;
use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use leasehold::tower::{
    ErrorResponseLayer, FenceError, FenceLayer, LockLayer, MemoryFenceStore, StatusMap,
};
use leasehold::{Error, FencingToken, LeaseInfo, LockConfig, Locker};
use metrics_exporter_prometheus::PrometheusHandle;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt, service_fn};

/// A write to the store: set `counter` to `value`, under fencing token `token`.
#[derive(Debug, Clone)]
pub struct Write {
    /// The counter.
    pub counter: String,
    /// The new value.
    pub value: u64,
    /// The writer's fencing token.
    pub token: FencingToken,
}

/// The protected resource: counters in memory, written only through [`Store::service`].
#[derive(Debug, Clone, Default)]
pub struct Store {
    values: Arc<Mutex<HashMap<String, u64>>>,
    fences: Arc<MemoryFenceStore>,
}

/// The store's write service, fenced: a stale token is a `FenceError::Stale`.
pub type WriteService = BoxCloneSyncService<Write, u64, FenceError<Infallible>>;

impl Store {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The current value of `counter` (0 if never written).
    pub fn get(&self, counter: &str) -> u64 {
        self.values
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(counter)
            .copied()
            .unwrap_or(0)
    }

    /// The highest token the fence accepted for `counter`.
    pub fn highest_token(&self, counter: &str) -> Option<FencingToken> {
        self.fences.highest(counter)
    }

    /// The write service: a [`FenceLayer`] in front of the counters.
    pub fn service(&self) -> WriteService {
        let values = Arc::clone(&self.values);
        let write = service_fn(move |w: Write| {
            let values = Arc::clone(&values);
            async move {
                values
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(w.counter, w.value);
                Ok::<_, Infallible>(w.value)
            }
        });
        let fenced = ServiceBuilder::new()
            .layer(FenceLayer::with_store(
                |w: &Write| Some((w.counter.clone(), w.token)),
                Arc::clone(&self.fences),
            ))
            .service(write);
        BoxCloneSyncService::new(fenced)
    }
}

/// Reads the configuration: the TOML file at `path` if one is given, else the in-memory
/// backend; in both cases the `LEASEHOLD_*` environment variables override it (for example
/// `LEASEHOLD_URL=postgres://…` or `LEASEHOLD_REQUIRE=correctness`).
pub fn load_config(path: Option<&Path>) -> Result<LockConfig, Error> {
    match path {
        Some(path) => LockConfig::load(path),
        None => LockConfig::new("memory://").with_env(),
    }
}

#[derive(Clone)]
struct AppState {
    store: Store,
    metrics: Option<PrometheusHandle>,
}

/// The lock key of a request to `/counters/{name}/increment`.
fn counter_key(req: &Request) -> Option<String> {
    let name = req
        .uri()
        .path()
        .strip_prefix("/counters/")?
        .strip_suffix("/increment")?;
    Some(format!("counters/{name}"))
}

/// The service: `locker` guards the increments, waiting at most `wait` for a lock; `metrics`
/// is rendered at `/metrics` when given.
pub fn router(
    locker: Locker,
    wait: Duration,
    store: Store,
    metrics: Option<PrometheusHandle>,
) -> Router {
    let lock = ServiceBuilder::new()
        .layer(ErrorResponseLayer::new(StatusMap::default()))
        .layer(
            LockLayer::new(locker, counter_key)
                .wait(wait)
                .route("POST /counters/{name}/increment"),
        );
    Router::new()
        .route(
            "/counters/{name}/increment",
            post(increment).route_layer(lock),
        )
        .route("/counters/{name}", get(read))
        .route("/metrics", get(render_metrics))
        .with_state(AppState { store, metrics })
}

/// `?work_ms=N`: how long the handler works under the lock.
fn work_time(uri: &Uri) -> Option<Duration> {
    let ms = uri
        .query()?
        .split('&')
        .find_map(|kv| kv.strip_prefix("work_ms="))?;
    ms.parse().ok().map(Duration::from_millis)
}

async fn increment(
    State(state): State<AppState>,
    UrlPath(name): UrlPath<String>,
    Extension(lease): Extension<LeaseInfo>,
    uri: Uri,
) -> Response {
    let Some(token) = lease.fencing else {
        let text = format!(
            "the configured backend ({}) mints no fencing token, and the store accepts only \
             fenced writes: configure one that does (require = \"correctness\")\n",
            lease.backend
        );
        return (StatusCode::NOT_IMPLEMENTED, text).into_response();
    };
    let current = state.store.get(&name);
    if let Some(work) = work_time(&uri) {
        tokio::time::sleep(work).await;
    }
    let write = Write {
        counter: name.clone(),
        value: current + 1,
        token,
    };
    match state.store.service().oneshot(write).await {
        Ok(value) => (
            StatusCode::OK,
            format!("{name} = {value} (fencing token {})\n", token.get()),
        )
            .into_response(),
        Err(FenceError::Stale { highest, .. }) => (
            StatusCode::CONFLICT,
            format!(
                "stale fencing token {}: {} already accepted\n",
                token.get(),
                highest.get()
            ),
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

async fn read(State(state): State<AppState>, UrlPath(name): UrlPath<String>) -> String {
    format!("{name} = {}\n", state.store.get(&name))
}

async fn render_metrics(State(state): State<AppState>) -> Response {
    match state.metrics {
        Some(handle) => handle.render().into_response(),
        None => (StatusCode::NOT_FOUND, "metrics are off\n").into_response(),
    }
}
