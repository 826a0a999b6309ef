//! One service, built from a `LockConfig` and nothing else, switched across every backend:
//! `LockLayer` holds a lease around each request and hands its fencing token to the handler,
//! and the handler writes through `FenceLayer` to a store that rejects stale tokens.
//!
//! On each backend a real fault takes the lease away while a request works under it: the
//! lease runs past its TTL unrenewed (memory), the lock file is deleted (file), the key is
//! deleted (Redis) or taken on every node (Redlock), the lock's session is ended with
//! `pg_terminate_backend` (PostgreSQL), the session lease is revoked (etcd). Then:
//!
//! - the request is aborted with `LeaseLost`, long before its work would have ended;
//! - the next request gets the lock, with a higher fencing token, and its write is accepted;
//! - the first holder's write, arriving late with its old token, is rejected by the fence
//!   (Redlock mints no token: the fence refuses both writes, which is what an efficiency lock
//!   gives a resource that demands fencing).
//!
//! Service URLs come from `scripts/services up` (through `leasehold-test-support`); under
//! `CI=true` a missing service fails the test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::Request;
use leasehold::tower::{FenceError, FenceLayer, LockError, LockLayer, MemoryFenceStore};
use leasehold::{FencingToken, LeaseInfo, LockConfig, RenewalSetting};
use leasehold_test_support::services::{self, Endpoints, Service, unique_prefix};
use tokio::sync::mpsc;
use tower::util::BoxCloneService;
use tower::{ServiceBuilder, ServiceExt, service_fn};

/// A write to the protected resource, with the writer's fencing token.
#[derive(Clone, Debug)]
struct Write {
    resource: String,
    token: Option<FencingToken>,
}

/// The resource behind its fence: answers with the token it accepted.
type Store = BoxCloneService<Write, Option<FencingToken>, FenceError<Infallible>>;

/// The locked service: a request names the resource and how long the handler works on it.
type Locked = BoxCloneService<Request<Job>, Written, LockError<FenceError<Infallible>, Written>>;

/// What a request's write answered: the token the fence accepted.
type Written = Option<FencingToken>;

#[derive(Clone, Debug)]
struct Job {
    resource: String,
    work: Duration,
}

fn store() -> Store {
    let fenced = ServiceBuilder::new()
        .layer(FenceLayer::with_store(
            |w: &Write| Some((w.resource.clone(), w.token?)),
            Arc::new(MemoryFenceStore::new()),
        ))
        .service(service_fn(|w: Write| async move {
            Ok::<_, Infallible>(w.token)
        }));
    BoxCloneService::new(fenced)
}

/// The service: a lease on the job's resource around a handler that tells `entered` its token,
/// works, then writes through `store`.
fn locked(config: &LockConfig, locker: leasehold::Locker, store: Store) -> Locked {
    let (entered, _) = mpsc::unbounded_channel::<Option<FencingToken>>();
    locked_with(config, locker, store, entered)
}

fn locked_with(
    config: &LockConfig,
    locker: leasehold::Locker,
    store: Store,
    entered: mpsc::UnboundedSender<Option<FencingToken>>,
) -> Locked {
    let handler = service_fn(move |req: Request<Job>| {
        let store = store.clone();
        let entered = entered.clone();
        async move {
            let token = req.extensions().get::<LeaseInfo>().and_then(|l| l.fencing);
            let _ = entered.send(token);
            tokio::time::sleep(req.body().work).await;
            let resource = req.body().resource.clone();
            store.oneshot(Write { resource, token }).await
        }
    });
    let svc = ServiceBuilder::new()
        .layer(
            LockLayer::new(locker, |req: &Request<Job>| {
                Some(req.body().resource.clone())
            })
            .wait(config.wait_budget()),
        )
        .service(handler);
    BoxCloneService::new(svc)
}

/// A backend under test, with what it takes to take its lease away for real.
enum Backend {
    /// The lease, unrenewed, runs past its TTL while the handler works (a holder paused past
    /// its lease).
    Memory,
    /// The lock file in this folder is deleted.
    File(PathBuf),
    /// The key is deleted on the node.
    Redis(Endpoints),
    /// Another value is set on every node, for 3 s (several renewal rounds).
    Redlock(Endpoints),
    /// The session holding the lock is terminated (`pg_terminate_backend`).
    Postgres(Endpoints),
    /// The holder's session lease is revoked.
    Etcd(Endpoints),
}

impl Backend {
    /// The backend of `service`.
    fn of(service: Service, endpoints: Endpoints) -> Self {
        match service {
            Service::Redis => Backend::Redis(endpoints),
            Service::Redlock => Backend::Redlock(endpoints),
            Service::Postgres => Backend::Postgres(endpoints),
            _ => Backend::Etcd(endpoints),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::File(_) => "file",
            Backend::Redis(_) => "redis",
            Backend::Redlock(_) => "redlock",
            Backend::Postgres(_) => "postgres",
            Backend::Etcd(_) => "etcd",
        }
    }

    /// The configuration: the backend's URL, a short lease (renewed, but for memory's), and a
    /// wait budget.
    fn config(&self) -> LockConfig {
        let (url, ttl_ms) = match self {
            Backend::Memory => ("memory://".to_owned(), 300),
            Backend::File(dir) => (format!("file://{}", dir.display()), 2_000),
            Backend::Redis(node) => (node.url().to_owned(), 1_500),
            Backend::Redlock(nodes) => {
                let hosts: Vec<String> = nodes.addrs().iter().map(ToString::to_string).collect();
                (format!("redlock://{}", hosts.join(",")), 1_500)
            }
            Backend::Postgres(db) => (db.url().to_owned(), 2_000),
            Backend::Etcd(members) => {
                let session = "session_ttl=3";
                (
                    format!("etcd://{}?{session}", members.urls().join(",")),
                    2_000,
                )
            }
        };
        let config = LockConfig::new(url)
            .with_ttl(Duration::from_millis(ttl_ms))
            .with_wait(Duration::from_secs(10));
        match self {
            Backend::Memory => config.with_renewal(RenewalSetting::Off),
            _ => config,
        }
    }

    /// Takes the lease on `key` away from its holder.
    async fn strike(&self, key: &str) {
        match self {
            Backend::Memory => {}
            Backend::File(dir) => std::fs::remove_file(dir.join(format!("{key}.lock")))
                .expect("the lock file exists while held"),
            Backend::Redis(node) => {
                let deleted: i64 = redis_on(node.url(), &["DEL", &redis_key(key)]).await;
                assert_eq!(deleted, 1, "the holder's key {:?}", redis_key(key));
            }
            Backend::Redlock(nodes) => {
                for url in nodes.urls() {
                    let _: () =
                        redis_on(url, &["SET", &redis_key(key), "intruder", "PX", "3000"]).await;
                }
            }
            Backend::Postgres(db) => terminate_session(db.url(), key).await,
            Backend::Etcd(members) => {
                let mut etcd = etcd_client::Client::connect(members.urls(), None)
                    .await
                    .unwrap();
                let queue = format!("{}{key}/", leasehold::etcd::DEFAULT_PREFIX);
                let options = etcd_client::GetOptions::new().with_prefix();
                let keys = etcd.get(queue.as_str(), Some(options)).await.unwrap();
                let holder = keys.kvs().iter().min_by_key(|kv| kv.create_revision());
                let lease = holder.map(|kv| kv.lease()).expect("a holder key");
                etcd.lease_revoke(lease).await.unwrap();
            }
        }
    }
}

/// Ends the PostgreSQL session that holds lock `key`, as an administrator would.
async fn terminate_session(url: &str, key: &str) {
    let (admin, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("admin connection");
    let conn = tokio::spawn(conn);
    let ended = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks \
             WHERE locktype = 'advisory' AND objsubid = 1 AND granted \
             AND ((classid::bigint << 32) | objid::bigint) = $1",
            &[&leasehold::postgres::advisory_key(key)],
        )
        .await
        .expect("terminate")
        .get::<_, i64>(0);
    assert_eq!(ended, 1, "one session holds {key:?}");
    drop(admin);
    let _ = conn.await;
}

/// The Redis key of lock `key` under the default prefix.
fn redis_key(key: &str) -> String {
    format!("{}{{{key}}}", leasehold::redis::DEFAULT_PREFIX)
}

/// One command on one Redis node.
async fn redis_on<T: redis::FromRedisValue>(url: &str, args: &[&str]) -> T {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd.query_async(&mut conn).await.unwrap()
}

/// The scenario, the same on every backend: see the file's docs.
async fn lost_mid_request(backend: Backend) {
    let test = backend.name();
    let config = backend.config();
    let key = unique_prefix(&format!("e2e-{test}"));
    let locker = config
        .build()
        .await
        .expect("the backend of the configuration");
    let mints = locker.capabilities().fencing != leasehold::FencingKind::None;
    let store = store();
    let (entered_tx, mut entered) = mpsc::unbounded_channel();
    let svc = locked_with(&config, locker.clone(), store.clone(), entered_tx);
    let job = |work| {
        Request::new(Job {
            resource: key.clone(),
            work,
        })
    };

    // A request that would work for a minute: the fault strikes once it runs under the lease.
    let first = tokio::spawn(svc.clone().oneshot(job(Duration::from_secs(60))));
    let old_token = entered.recv().await.expect("the first request runs");
    assert_eq!(old_token.is_some(), mints, "fencing token of {test}");
    let struck = Instant::now();
    backend.strike(&key).await;
    let aborted = tokio::time::timeout(Duration::from_secs(20), first)
        .await
        .expect("the request is aborted once its lease is lost")
        .unwrap();
    assert!(
        matches!(aborted, Err(LockError::LeaseLost { .. })),
        "{test}: {aborted:?}"
    );
    println!("{test}: aborted {:?} after the fault", struck.elapsed());

    // The next holder writes with a higher token; the old holder's late write is refused.
    let next = locked(&config, locker, store.clone())
        .oneshot(job(Duration::ZERO))
        .await;
    let late = store
        .oneshot(Write {
            resource: key.clone(),
            token: old_token,
        })
        .await;
    if mints {
        let new_token = next.expect("the next holder's write");
        assert!(
            new_token > old_token,
            "{test}: {new_token:?} after {old_token:?}"
        );
        assert!(
            matches!(late, Err(FenceError::Stale { highest, .. }) if Some(highest) == new_token),
            "{test}: {late:?}"
        );
    } else {
        assert!(
            matches!(next, Err(LockError::Service(FenceError::MissingToken))),
            "{test}: {next:?}"
        );
        assert!(
            matches!(late, Err(FenceError::MissingToken)),
            "{test}: {late:?}"
        );
    }
}

/// Every backend at once; a backend whose service is missing fails under `CI=true` (and is
/// skipped, saying so, elsewhere).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_backend_aborts_the_request_and_fences_the_old_holder() {
    let dir = std::env::temp_dir().join(unique_prefix("e2e-file"));
    std::fs::create_dir_all(&dir).unwrap();
    let mut backends = vec![Backend::Memory, Backend::File(dir.clone())];
    for service in [
        Service::Redis,
        Service::Redlock,
        Service::Postgres,
        Service::Etcd,
    ] {
        if let Some(endpoints) = services::require(service) {
            backends.push(Backend::of(service, endpoints));
        }
    }
    let runs: Vec<_> = backends
        .into_iter()
        .map(|backend| tokio::spawn(lost_mid_request(backend)))
        .collect();
    let mut failed = 0;
    for run in runs {
        // A failed backend's panic message is already on stderr, with its name.
        failed += usize::from(run.await.is_err());
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(failed, 0, "backends failed: see their messages above");
}
