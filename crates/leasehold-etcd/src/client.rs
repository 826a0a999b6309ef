//! What every acquisition of one backend shares: the etcd client and configuration, the
//! session lease, the in-process lock table, and the etcd requests built on them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, GetOptions, GetResponse, KeyValue, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse,
};
use leasehold_core::{Backoff, Error, ErrorKind, FencingToken, ReleaseGate};

use crate::NAME;
use crate::config::EtcdConfig;
use crate::error::{EtcdError, Reauth, with_timeout};
use crate::local::LocalTable;
use crate::session::{Session, lease_secs};

/// How many session leases (distinct TTLs) a backend keeps before it revokes the ones nobody
/// uses.
const IDLE_SESSIONS: usize = 8;

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) config: EtcdConfig,
    /// The current session leases ([`LeaseMode::Session`]), one per distinct lease TTL in
    /// whole seconds ([`lease_secs`]); each replaced when lost.
    pub(crate) sessions: tokio::sync::Mutex<HashMap<i64, Arc<Session>>>,
    /// In-process exclusion: two local tasks never share a waiter key (lock prefix + session
    /// lease; etcd would count them as one owner). The key is the one the slot and the grant
    /// hold: stored once per held lock.
    pub(crate) local: Arc<LocalTable>,
    pub(crate) releases: ReleaseGate,
    /// Renews the client's token after a change to the cluster's users or roles.
    pub(crate) reauth: Reauth,
}

impl Inner {
    pub(crate) fn new(client: Client, config: EtcdConfig) -> Self {
        let releases = ReleaseGate::new(config.releases_in_flight);
        Self {
            reauth: Reauth::new(client.clone()),
            client,
            config,
            sessions: tokio::sync::Mutex::new(HashMap::new()),
            local: Arc::default(),
            releases,
        }
    }

    /// The session lease for locks of `ttl`: the live one of the same [lease TTL](lease_secs),
    /// or a new one. Sessions nobody uses any more are revoked once more than
    /// [`IDLE_SESSIONS`] TTLs are in use.
    pub(crate) async fn session(&self, ttl: Duration) -> Result<Arc<Session>, Error> {
        let secs = lease_secs(ttl);
        let mut sessions = self.sessions.lock().await;
        if let Some(s) = sessions.get(&secs)
            && !s.is_lost()
        {
            return Ok(Arc::clone(s));
        }
        // Boxed: a grant is rare, and inline its request would make every acquisition's
        // future (the caller's, and the task's) as large as a whole gRPC call.
        let s = Box::pin(Session::grant(
            self.client.lease_client(),
            ttl,
            self.config.request_timeout,
            true,
        ))
        .await
        .map_err(|e| e.into_core("granting the session lease"))?;
        sessions.retain(|_, s| !s.is_lost());
        if sessions.len() >= IDLE_SESSIONS {
            // Only the map refers to it: no grant, no acquisition uses it (dropping revokes).
            sessions.retain(|_, s| Arc::strong_count(s) > 1);
        }
        sessions.insert(secs, Arc::clone(&s));
        Ok(s)
    }

    /// The live session lease of locks of `ttl`, if there is one.
    pub(crate) async fn live_session(&self, ttl: Duration) -> Option<Arc<Session>> {
        let sessions = self.sessions.lock().await;
        sessions
            .get(&lease_secs(ttl))
            .filter(|s| !s.is_lost())
            .cloned()
    }

    /// The live session lease whose id is `id`, if there is one.
    pub(crate) async fn session_by_id(&self, id: i64) -> Option<Arc<Session>> {
        let sessions = self.sessions.lock().await;
        sessions
            .values()
            .find(|s| s.id() == id && !s.is_lost())
            .cloned()
    }

    /// Whether no session lease of ours lives any more.
    pub(crate) async fn no_live_session(&self) -> bool {
        let sessions = self.sessions.lock().await;
        sessions.values().all(|s| s.is_lost())
    }

    pub(crate) async fn txn(&self, what: &'static str, txn: Txn) -> Result<TxnResponse, EtcdError> {
        let kv = self.client.kv_client();
        with_timeout(
            self.config.request_timeout,
            what,
            Some(&self.reauth),
            || {
                let (mut kv, txn) = (kv.clone(), txn.clone());
                async move { kv.txn(txn).await }
            },
        )
        .await
    }

    pub(crate) async fn get(
        &self,
        what: &'static str,
        key: Vec<u8>,
        opts: Option<GetOptions>,
    ) -> Result<GetResponse, EtcdError> {
        let kv = self.client.kv_client();
        with_timeout(
            self.config.request_timeout,
            what,
            Some(&self.reauth),
            || {
                let (mut kv, key, opts) = (kv.clone(), key.clone(), opts.clone());
                async move { kv.get(key, opts).await }
            },
        )
        .await
    }

    /// Deletes `key` if its value is `owner`: `Ok(true)` if it did.
    pub(crate) async fn delete_if_owner(&self, key: &[u8], owner: &str) -> Result<bool, EtcdError> {
        let txn = Txn::new()
            .when([Compare::value(key.to_vec(), CompareOp::Equal, owner)])
            .and_then([TxnOp::delete(key.to_vec(), None)]);
        Ok(self.txn("release", txn).await?.succeeded())
    }

    /// Every key under `prefix` whose value is `owner`.
    pub(crate) async fn find_owner(
        &self,
        prefix: &[u8],
        owner: &str,
    ) -> Result<Vec<KeyValue>, EtcdError> {
        let resp = self
            .get(
                "get",
                prefix.to_vec(),
                Some(GetOptions::new().with_prefix()),
            )
            .await?;
        Ok(resp
            .kvs()
            .iter()
            .filter(|kv| kv.value() == owner.as_bytes())
            .cloned()
            .collect())
    }
}

/// An etcd key a grant holds, shared (not copied) by the grant, its in-process slot and the
/// in-process lock table: a fleet of held locks stores each key once.
pub(crate) type Key = Arc<[u8]>;

/// The key a session lease waits on and holds a lock with: `<lock prefix><lease id in hex>`,
/// exactly as `etcdctl lock` (the v3 concurrency recipe) names it.
pub(crate) fn waiter_key(prefix: &[u8], lease: i64) -> Vec<u8> {
    let hex = format!("{lease:x}");
    let mut key = Vec::with_capacity(prefix.len() + hex.len());
    key.extend_from_slice(prefix);
    key.extend_from_slice(hex.as_bytes());
    key
}

/// The oldest key under a prefix: the lock's holder.
pub(crate) fn first_created() -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

pub(crate) fn first_kv(resp: &TxnResponse, op: usize) -> Option<KeyValue> {
    match resp.op_responses().into_iter().nth(op) {
        Some(TxnOpResponse::Get(g)) => g.kvs().first().cloned(),
        _ => None,
    }
}

/// Every key a get of a transaction answered (its `op`-th operation).
pub(crate) fn all_kvs(resp: &TxnResponse, op: usize) -> Vec<KeyValue> {
    match resp.op_responses().into_iter().nth(op) {
        Some(TxnOpResponse::Get(g)) => g.kvs().to_vec(),
        _ => Vec::new(),
    }
}

pub(crate) fn revision(resp: &TxnResponse) -> Result<i64, Error> {
    let rev = resp
        .header()
        .map(|h| h.revision())
        .ok_or_else(|| Error::new(ErrorKind::Backend, NAME, "etcd answered without a revision"))?;
    checked_revision(rev)
}

/// A revision etcd answered, checked: at least 1 and below `i64::MAX`, so that the
/// revision before it and the one after it exist (a hostile or broken server gets an error,
/// never an overflow or a token of 0).
pub(crate) fn checked_revision(rev: i64) -> Result<i64, Error> {
    if rev > 0 && rev < i64::MAX {
        Ok(rev)
    } else {
        Err(Error::new(
            ErrorKind::Backend,
            NAME,
            format!("etcd answered an impossible revision {rev}"),
        ))
    }
}

/// The fencing token of a key created at revision `rev` ([checked](checked_revision)).
pub(crate) fn token(rev: i64) -> Result<FencingToken, Error> {
    let rev = checked_revision(rev)?;
    Ok(FencingToken::new(rev.unsigned_abs()))
}

/// Deletes our key after an acquisition that did not end in a grant (or a grant nobody
/// took, or whose release failed), retrying with jittered backoff (up to 5 s apart) for as
/// long as the session lease lives: never given up while the key could still hold the lock;
/// once the lease is gone, so is the key.
pub(crate) async fn finish(inner: &Inner, key: &[u8], owner: &str, session: &Session) {
    const BACKOFF: Backoff = Backoff {
        initial: Duration::from_millis(50),
        max: Duration::from_secs(5),
    };
    let mut retry = 0u32;
    loop {
        match inner.delete_if_owner(key, owner).await {
            Ok(_) => return,
            Err(_) if session.is_lost() => return,
            Err(e) => {
                retry = retry.saturating_add(1);
                tracing::debug!(error = %e, retry, "leasehold.etcd: cleanup delete failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(BACKOFF.delay(retry)) => {}
                    () = session.lost() => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_revisions_are_errors() {
        assert_eq!(checked_revision(7).ok(), Some(7));
        assert_eq!(token(7).ok(), Some(FencingToken::new(7)));
        for bad in [0, -1, i64::MIN, i64::MAX] {
            assert!(checked_revision(bad).is_err(), "{bad}");
            assert!(token(bad).is_err(), "{bad}");
        }
    }
}
