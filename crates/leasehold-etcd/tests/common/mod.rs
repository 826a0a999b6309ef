//! Shared helpers of the etcd integration tests.
#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, GetOptions};
use leasehold_core::{Lease, LockBackend, Locker, Renewal};
use leasehold_etcd::{EtcdBackend, EtcdConfig, LeaseMode};
use leasehold_test_support::conformance::{BoxFuture, ExpireHook, Target};
use leasehold_test_support::harness;
use leasehold_test_support::services::{Endpoints, Service};

/// The session TTL used by the tests (etcd's minimum is about 2 s with default timing).
pub const SESSION_TTL: Duration = Duration::from_secs(5);

/// A fresh prefix for one test's lock names, so tests never see each other's keys.
pub fn prefix(test: &str) -> String {
    harness::key_prefix(test, "/")
}

/// A locker with a 5 s TTL, renewed, over `backend`.
pub fn locker(backend: EtcdBackend) -> Locker {
    harness::locker(backend, Duration::from_secs(5), Renewal::Auto)
}

/// A backend on `endpoints` with its own connection and session, under `prefix`.
pub async fn backend(endpoints: &Endpoints, prefix: &str, mode: LeaseMode) -> EtcdBackend {
    connect(endpoints, config(endpoints, prefix, mode)).await
}

/// The configuration of [`backend`].
pub fn config(endpoints: &Endpoints, prefix: &str, mode: LeaseMode) -> EtcdConfig {
    EtcdConfig::new(endpoints.urls().iter().cloned())
        .with_prefix(prefix)
        .unwrap_or_else(|e| panic!("{e}"))
        .with_lease_mode(mode)
        .with_session_ttl(SESSION_TTL)
        .with_request_timeout(Duration::from_secs(3))
}

/// A backend of `cfg` on `endpoints`.
pub async fn connect(endpoints: &Endpoints, cfg: EtcdConfig) -> EtcdBackend {
    match EtcdBackend::connect(cfg).await {
        Ok(b) => b,
        Err(e) => panic!("cannot connect to etcd at {:?}: {e}", endpoints.urls()),
    }
}

/// A raw etcd client, for checking what is stored and injecting faults.
pub async fn raw(endpoints: &Endpoints) -> Client {
    match Client::connect(endpoints.urls(), None).await {
        Ok(c) => c,
        Err(e) => panic!("raw etcd client: {e}"),
    }
}

/// How many keys live under `prefix`.
pub async fn count(client: &Client, prefix: &str) -> Result<usize, etcd_client::Error> {
    let mut kv = client.kv_client();
    let resp = kv
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await?;
    Ok(usize::try_from(resp.count()).unwrap_or(usize::MAX))
}

/// The lease id of the key that holds `lease` (found by its owner value, unique per
/// acquisition, anywhere under the test's `prefix`: a lock or a permit), if any.
pub async fn lease_of(
    client: &Client,
    prefix: &str,
    lease: &Lease,
) -> Result<Option<i64>, etcd_client::Error> {
    let mut kv = client.kv_client();
    let resp = kv
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await?;
    Ok(resp
        .kvs()
        .iter()
        .find(|kv| kv.value() == lease.owner().as_str().as_bytes())
        .map(|kv| kv.lease()))
}

/// The conformance target on `service`: two backends (separate connections and sessions) under
/// one fresh prefix; `held` counts keys under it, `expire` revokes the grant's lease.
pub async fn target(service: Service, mode: LeaseMode, name: &str) -> Option<Target> {
    let endpoints = leasehold_test_support::services::require(service)?;
    let prefix = prefix(name);
    let primary: Arc<dyn LockBackend> = Arc::new(backend(&endpoints, &prefix, mode).await);
    let other: Arc<dyn LockBackend> = Arc::new(backend(&endpoints, &prefix, mode).await);
    let client = raw(&endpoints).await;
    let held = {
        let (client, prefix) = (client.clone(), prefix.clone());
        Arc::new(move || {
            let (client, prefix) = (client.clone(), prefix.clone());
            Box::pin(async move {
                count(&client, &prefix).await.map_err(|e| {
                    leasehold_core::Error::new(
                        leasehold_core::ErrorKind::Backend,
                        "test",
                        e.to_string(),
                    )
                })
            }) as BoxFuture<'static, _>
        })
    };
    let expire = expire_hook(move |lease: &Lease| {
        let (client, prefix) = (client.clone(), prefix.clone());
        Box::pin(async move {
            match lease_of(&client, &prefix, lease).await {
                Ok(Some(id)) => {
                    if let Err(e) = client.lease_client().revoke(id).await {
                        panic!("revoke {id:x}: {e}");
                    }
                }
                Ok(None) => panic!("no key holds {lease:?}"),
                Err(e) => panic!("looking up {lease:?}: {e}"),
            }
        })
    });
    Some(
        Target::new(primary, other, Duration::from_secs(2))
            .with_held(held)
            .with_expire(expire),
    )
}

pub fn expire_hook<F>(f: F) -> ExpireHook
where
    F: for<'a> Fn(&'a Lease) -> BoxFuture<'a, ()> + Send + Sync + 'static,
{
    Arc::new(f)
}
