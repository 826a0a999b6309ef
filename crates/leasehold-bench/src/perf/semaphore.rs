//! The `semaphore` group of `leasehold-bench perf`: on each backend that gives semaphores, an
//! uncontended permit cycle (try-acquire + release of one of [`PERMITS`] permits, one client)
//! against the same backend's lock cycle, the two taking turns in the rounds of the cycle
//! scenario, each on backends (connections) of its own.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use futures_util::FutureExt as _;
use leasehold_core::{IntoLockKey as _, LockBackend, MemoryBackend, PermitLimit};
use leasehold_etcd::EtcdConfig;
use leasehold_test_support::services::{self, Service};

use super::groups::{
    Group, Tag, etcd_backend, file_backends, pg_backend, redis_backend, subject, urls,
};
use super::model::{Params, Row, Scenario};
use super::scenarios::CYCLE_KEY;
use super::{scenarios, setup_failed};
use crate::harness::BoxError;
use crate::stats::Spread;
use crate::subjects::{Count, Kind, Ours, Subject, make};

/// Permits per key of the measured semaphores.
pub(super) const PERMITS: u32 = 4;

/// The semaphore rows of every backend that gives semaphores, on runtime `rt` (`out`: where
/// the file backend's lock folder goes).
pub(super) async fn run(p: &Params, rt: &str, out: &Path) -> Vec<Row> {
    let mut rows = Vec::new();
    for name in SEMAPHORE_BACKENDS {
        let group = match PermitLimit::new(PERMITS) {
            Ok(limit) => build_semaphore_group(name, out, limit, p.quick).await,
            Err(e) => Err(e.into()),
        };
        let mut pair = match group {
            Ok(g) => scenarios::cycle_scenario(p, rt, &g).await,
            Err(e) => vec![setup_failed(rt, &format!("semaphore on {name}"), &e)],
        };
        mark(&mut pair);
        rows.extend(pair);
    }
    rows
}

/// Marks a group's rows as semaphore rows and gives the permit row its ratio to the lock row
/// (the first) measured in the same rounds.
fn mark(rows: &mut [Row]) {
    let lock = rows.first().and_then(|r| r.p50);
    for r in rows.iter_mut() {
        r.scenario = Scenario::Semaphore;
    }
    if let (Some(lock), Some(permit)) = (lock, rows.get_mut(1))
        && let Some(p50) = permit.p50
        && !lock.is_zero()
    {
        let x = p50.as_secs_f64() / lock.as_secs_f64();
        permit.ratio = Some((Spread::of(&mut [x]), "of the lock cycle".into()));
    }
}

/// The backends of the `semaphore` group, as their lock groups are named.
const SEMAPHORE_BACKENDS: [&str; 5] = ["memory", "file", "redis", "postgres-tcp", "etcd"];

/// The semaphore group of backend `name` (one of [`SEMAPHORE_BACKENDS`]): ours as a lock and
/// ours as a semaphore of `limit` permits, each on backends of its own, titled as the lock
/// group.
async fn build_semaphore_group(
    name: &'static str,
    out: &Path,
    limit: PermitLimit,
    quick: bool,
) -> Result<Group, BoxError> {
    let mut g = Group::new(false);
    let (title, subjects) = match name {
        "memory" => ("memory (in process)", memory_lock_and_permits(limit)?),
        "file" => {
            let dir = g.lock_dir(out)?;
            let (lock, lock_count) = file_backends(dir.clone());
            let (sem, sem_count) = file_backends(dir);
            let lock = make(move || std::future::ready(lock().and_then(Ours::new)));
            let sem =
                make(move || std::future::ready(sem().and_then(|b| semaphore_client(b, limit))));
            let subjects = vec![
                Subject::new(
                    lock_label("FileBackend"),
                    Kind::Ours,
                    false,
                    lock,
                    lock_count,
                ),
                Subject::new(
                    permits_label("FileBackend", limit),
                    Kind::Ours,
                    false,
                    sem,
                    sem_count,
                ),
            ];
            ("file (flock, local disk)", subjects)
        }
        "redis" => {
            let url = urls(Service::Redis)?;
            let count = |t: &Tag| Count::Redis {
                urls: url.clone(),
                needle: t.prefix.clone(),
            };
            let u = url.clone();
            let subjects = lock_and_permits("RedisBackend", limit, count, move |t| {
                redis_backend(u.clone(), t.prefix, false)
            });
            ("redis (single node)", subjects)
        }
        "postgres-tcp" => {
            let conninfo = services::lookup(Service::Postgres)?.url().to_owned();
            let count = |t: &Tag| Count::Postgres {
                conninfo: conninfo.clone(),
                app: t.app.clone(),
            };
            let c = conninfo.clone();
            let subjects = lock_and_permits("PostgresBackend", limit, count, move |t| {
                let c = c.clone();
                async move { pg_backend(&c, t.prefix, t.app, quick).await }
            });
            ("postgres over TCP", subjects)
        }
        "etcd" => {
            let endpoints = urls(Service::Etcd)?;
            let count = |t: &Tag| Count::Etcd {
                endpoints: endpoints.clone(),
                prefix: t.prefix.clone(),
                leases: None,
            };
            let e = endpoints.clone();
            let subjects =
                lock_and_permits("EtcdBackend (session lease)", limit, count, move |t| {
                    let cfg = EtcdConfig::new(e.clone()).with_prefix(t.prefix);
                    async move { etcd_backend(cfg?).await }
                });
            ("etcd, single member", subjects)
        }
        other => return Err(format!("no semaphore subjects for group {other:?}").into()),
    };
    g.title = title.to_owned();
    g.subjects = subjects;
    Ok(g)
}

/// Ours on `backend` as a lock, then as a semaphore of `limit` permits, each subject on
/// backends of its own that `connect` opens.
fn lock_and_permits<F, Fut>(
    backend: &str,
    limit: PermitLimit,
    count: impl Fn(&Tag) -> Count,
    connect: F,
) -> Vec<Subject>
where
    F: Fn(Tag) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<Arc<dyn LockBackend>, BoxError>> + Send + 'static,
{
    let c = connect.clone();
    vec![
        subject(
            lock_label(backend),
            Kind::Ours,
            "perf-sem-lock",
            &count,
            move |t| {
                let b = c(t);
                async move { Ours::new(b.await?) }
            },
        ),
        subject(
            permits_label(backend, limit),
            Kind::Ours,
            "perf-sem",
            &count,
            move |t| {
                let b = connect(t);
                async move { semaphore_client(b.await?, limit) }
            },
        ),
    ]
}

fn lock_label(backend: &str) -> String {
    format!("leasehold {backend}: lock")
}

fn permits_label(backend: &str, limit: PermitLimit) -> String {
    format!("leasehold {backend}: semaphore, {} permits", limit.get())
}

/// A client taking permits of `backend`'s semaphore view.
fn semaphore_client(backend: Arc<dyn LockBackend>, limit: PermitLimit) -> Result<Ours, BoxError> {
    let view: Arc<dyn LockBackend> = backend.semaphore(limit)?;
    Ours::new(view)
}

/// The memory backend as a lock and as a semaphore of `limit` permits (one backend; the
/// permits of the cycle's key counted through the view).
fn memory_lock_and_permits(limit: PermitLimit) -> Result<Vec<Subject>, BoxError> {
    let backend = Arc::new(MemoryBackend::new());
    let view = Arc::clone(&backend).semaphore(limit)?;
    let key = CYCLE_KEY.into_lock_key()?;
    let held = move || {
        let holders = view.holders(&key).now_or_never();
        holders.and_then(Result::ok).map_or(usize::MAX, |v| v.len())
    };
    let (b, b2) = (Arc::clone(&backend), Arc::clone(&backend));
    let lock = make(move || std::future::ready(Ours::new(Arc::clone(&b) as _)));
    let permits = make(move || std::future::ready(semaphore_client(Arc::clone(&b2) as _, limit)));
    Ok(vec![
        Subject::new(
            lock_label("MemoryBackend"),
            Kind::Ours,
            true,
            lock,
            Count::Local(Box::new(move || backend.held_count())),
        ),
        Subject::new(
            permits_label("MemoryBackend", limit),
            Kind::Ours,
            true,
            permits,
            Count::Local(Box::new(held)),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::perf::model::test_row;

    #[test]
    fn the_permit_row_gets_its_ratio_to_the_lock_row() {
        let mut rows = vec![test_row("lock", "ours", 2), test_row("permit", "ours", 3)];
        mark(&mut rows);
        assert!(rows.iter().all(|r| r.scenario == Scenario::Semaphore));
        assert!(rows[0].ratio.is_none());
        let (s, of) = rows[1].ratio.clone().unwrap_or_else(|| panic!("no ratio"));
        assert!((s.median - 1.5).abs() < 1e-9, "{s:?}");
        assert_eq!(of, "of the lock cycle");
        // No lock figure, no ratio.
        let mut rows = vec![test_row("lock", "ours", 2), test_row("permit", "ours", 3)];
        rows[0].p50 = None;
        mark(&mut rows);
        assert!(rows[1].ratio.is_none());
        assert_eq!(rows[1].p50, Some(Duration::from_millis(3)));
    }
}
